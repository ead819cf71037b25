// The subscriber process of bench/publish.mjs: connects to a PUB endpoint, counts batches until
// it has `batches`, checks the seqs are contiguous, prints JSON {batches, seconds, gaps}.
import { Subscriber } from 'zeromq';

const [endpoint, want] = process.argv.slice(2);
const sub = new Subscriber({ receiveHighWaterMark: 0 });
sub.connect(endpoint);
sub.subscribe();
console.log('ready');
let n = 0;
let gaps = 0;
let last = 0n;
let t0 = 0;
for await (const [, seq] of sub) {
  if (n === 0) t0 = performance.now();
  const s = seq.readBigUInt64BE();
  if (last !== 0n && s !== last + 1n) gaps++;
  last = s;
  if (++n === Number(want)) break;
}
console.log(JSON.stringify({ batches: n, seconds: (performance.now() - t0) / 1000, gaps, lastSeq: String(last) }));
sub.close();
