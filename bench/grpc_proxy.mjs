// kvplane's gRPC server in front of an engine for bench/smg.mjs: no KV event stream, every
// engine RPC forwarded to UPSTREAM. Prints its port.
//
//   node bench/grpc_proxy.mjs UPSTREAM
import { KvGrpcServer } from '../dist/index.mjs';

const grpc = await KvGrpcServer.create({ stream: null, host: '127.0.0.1', upstream: process.argv[2] });
process.stdout.write(`${grpc.port}\n`);
