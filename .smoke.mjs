import { KvEventPublisher, decodeBatches } from '/work/main/dist/index.mjs';
import { Subscriber, Dealer } from 'zeromq';
const p = await KvEventPublisher.create({ endpoint: 'tcp://127.0.0.1:*', replayEndpoint: 'tcp://127.0.0.1:*' });
console.log(p.endpoint, p.replayEndpoint);
const sub = new Subscriber(); sub.connect(p.endpoint); sub.subscribe();
await new Promise(r => setTimeout(r, 200));
for (let i = 0; i < 3000; i++) p.stored({ blockHashes: [BigInt(i + 1)], parentBlockHash: i ? BigInt(i) : null, tokenIds: new Uint32Array(16).fill(i), blockSize: 16 });
await p.flush();
let n = 0, last;
for await (const [topic, seq, payload] of sub) { n += decodeBatches(payload, 'vllm').batches[0].events.length; last = seq.readBigUInt64BE(); if (n >= 3000) break; }
console.log('sub got', n, 'last seq', last, p.stats());
const d = new Dealer(); d.connect(p.replayEndpoint);
const b = Buffer.alloc(8); b.writeBigUInt64BE(2n); await d.send([Buffer.alloc(0), b]);
for await (const f of d) { console.log(f.length, f[2].toString('hex'), f[3].length); if (f[2].equals(Buffer.alloc(8, 0xff))) break; }
console.log(p.stats().replay);
await p.close(); sub.close(); d.close();
