// The engine's own gRPC server for bench/smg.mjs: vLLM's `Generate` answering each request with
// one response holding the request's bytes. Prints its port.
//
//   node bench/grpc_echo.mjs
import { Server, ServerCredentials } from '@grpc/grpc-js';
import { rawMethod } from '../dist/index.mjs';

const server = new Server();
server.addService(
  { Generate: rawMethod('/vllm.grpc.engine.VllmEngine/Generate', false, true) },
  {
    Generate: (call) => {
      call.write(call.request);
      call.end();
    },
  },
);
server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (err, port) => {
  if (err) throw err;
  process.stdout.write(`${port}\n`);
});
