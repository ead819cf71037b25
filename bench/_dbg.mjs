import { RouterIndex } from '../dist/index.mjs';
const index = new RouterIndex({ blockSize: 16, zmqReceive: process.argv[3], onWarning: (m, d) => console.log('warn', m, d) });
const sub = index.subscribe(7n, { kind: 'zmq', endpoint: process.argv[2] });
await new Promise((r) => setTimeout(r, 3000));
console.log(sub.stats().linkBatches, index.stats().tiers, index.stats().drops, index.stats().workers);
await index.close();
