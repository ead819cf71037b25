// The baseline for the index benches: a straightforward pure-TypeScript index built on Map and
// Set, hashing with kvplane's hashBlocks (one call per stored event), as a router written in
// TypeScript would do it.
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { hashBlocks } = require('../../dist/index.js');

export class TsIndex {
  /** seq hash -> Set of worker keys */
  blocks = new Map();
  /** worker key -> Map(engine hash -> { seq, parent, tokens }) */
  workers = new Map();

  #worker(w) {
    let m = this.workers.get(w);
    if (!m) {
      m = new Map();
      this.workers.set(w, m);
    }
    return m;
  }

  apply(w, ev) {
    const mine = this.#worker(w);
    if (ev.type === 'cleared') {
      for (const { seq } of mine.values()) this.#drop(seq, w);
      mine.clear();
      return;
    }
    if (ev.type === 'removed') {
      for (const h of ev.blockHashes) {
        const b = mine.get(h);
        if (!b) continue;
        mine.delete(h);
        this.#drop(b.seq, w);
      }
      return;
    }
    let parentSeq;
    if (ev.parentBlockHash != null) {
      const p = mine.get(ev.parentBlockHash);
      if (!p) return;
      parentSeq = p.seq;
    }
    const opts = { algo: 'xxh3', blockSize: ev.blockSize };
    if (parentSeq !== undefined) opts.parent = parentSeq;
    const seqs = hashBlocks(ev.tokenIds, opts);
    let parent = ev.parentBlockHash ?? null;
    ev.blockHashes.forEach((h, i) => {
      const seq = seqs[i];
      const tokens = ev.tokenIds.subarray(i * ev.blockSize, (i + 1) * ev.blockSize);
      mine.set(h, { seq, parent, tokens });
      let set = this.blocks.get(seq);
      if (!set) {
        set = new Set();
        this.blocks.set(seq, set);
      }
      set.add(w);
      parent = h;
    });
  }

  #drop(seq, w) {
    const set = this.blocks.get(seq);
    if (!set) return;
    set.delete(w);
    if (set.size === 0) this.blocks.delete(seq);
  }

  /** Per worker holding block 0: consecutive leading blocks held (a linear walk). */
  findMatches(seqHashes) {
    const scores = new Map();
    let active = null;
    for (let i = 0; i < seqHashes.length; i++) {
      const set = this.blocks.get(seqHashes[i]);
      if (!set) break;
      if (active === null) active = new Set(set);
      for (const w of active) {
        if (!set.has(w)) active.delete(w);
        else scores.set(w, i + 1);
      }
      if (active.size === 0) break;
    }
    return scores;
  }

  /** Every worker's blocks as stored events, one per block, parents before children. */
  dump() {
    const out = [];
    for (const [w, mine] of this.workers) {
      const events = [];
      const emitted = new Set();
      const emit = (h, b) => {
        if (emitted.has(h)) return;
        if (b.parent !== null && mine.has(b.parent)) emit(b.parent, mine.get(b.parent));
        emitted.add(h);
        events.push({
          type: 'stored',
          blockHashes: [h],
          parentBlockHash: b.parent,
          tokenIds: b.tokens,
          blockSize: b.tokens.length,
        });
      };
      for (const [h, b] of mine) emit(h, b);
      out.push({ worker: w, events });
    }
    return out;
  }
}
