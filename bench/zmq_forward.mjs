// The floor of a Node relay on this machine: a zeromq.js SUB whose messages are sent on as they
// are by a PUB, no decode and no work (bench/relay.mjs --only forward). Prints its endpoint.
//   node bench/zmq_forward.mjs SUB_ENDPOINT
import { Publisher, Subscriber } from 'zeromq';

const sub = new Subscriber({ linger: 0, receiveHighWaterMark: 10_000 });
const pub = new Publisher({ linger: 0, sendHighWaterMark: 10_000 });
await pub.bind('tcp://127.0.0.1:*');
sub.connect(process.argv[2]);
sub.subscribe();
console.log(JSON.stringify({ endpoint: pub.lastEndpoint }));
process.on('SIGTERM', () => {
  sub.close();
  pub.close();
});
for await (const frames of sub) await pub.send(frames);
