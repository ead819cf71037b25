// The floor of a Node gRPC proxy on this machine, for bench/smg.mjs: every HTTP/2 stream passed
// to UPSTREAM as it is (headers, data both ways, trailers) with Node's own http2 module, no gRPC
// library and nothing decoded. Prints its port.
//
//   node bench/http2_forward.mjs UPSTREAM
import http2 from 'node:http2';

const upstream = http2.connect(`http://${process.argv[2]}`);
const HOP = new Set([':method', ':path', ':scheme', ':authority', 'content-type', 'te', 'grpc-timeout']);
const server = http2.createServer();
server.on('stream', (down, headers) => {
  const fwd = {};
  for (const [k, v] of Object.entries(headers)) if (HOP.has(k) || !k.startsWith(':')) fwd[k] = v;
  const up = upstream.request(fwd, { endStream: false, waitForTrailers: false });
  up.on('response', (h) => {
    const out = {};
    for (const [k, v] of Object.entries(h)) if (!k.startsWith(':') || k === ':status') out[k] = v;
    down.respond(out, { waitForTrailers: true });
  });
  let trailers = {};
  up.on('trailers', (t) => {
    trailers = t;
  });
  down.on('wantTrailers', () => down.sendTrailers(trailers));
  down.pipe(up);
  up.pipe(down);
  down.on('close', () => up.close());
});
server.listen(0, '127.0.0.1', () => process.stdout.write(`${server.address().port}\n`));
