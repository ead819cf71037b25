import { describe, expect, it } from 'vitest';
import { type FollowStep, RankFollower } from '../src/sources/engine/follower.js';

const b = (seq: number) => ({ seq: BigInt(seq), payload: Buffer.from([seq]) });
/** The fetch in progress: fetches are numbered from 1 per follower, the tests start one at a time. */
const fetches = new WeakMap<RankFollower, number>();
const fetchId = (f: RankFollower) => fetches.get(f) ?? 0;
const follow = (f: RankFollower, steps: FollowStep[]) => {
  for (const s of steps) if (s.kind === 'fetch' || s.kind === 'resync') fetches.set(f, s.fetch);
  return steps;
};
const live = (f: RankFollower, batch: ReturnType<typeof b>) => follow(f, f.live(batch));
/** Steps as short strings: `a3` applies seq 3, `f2` fetches from 2, `c:gap` clears. */
const short = (steps: FollowStep[]) =>
  steps.map((s) => (s.kind === 'apply' ? `a${s.batch.seq}` : s.kind === 'fetch' ? `f${s.from}` : `c:${s.reason}`));

describe('RankFollower: one engine rank followed by its seqs', () => {
  it('holds live batches while the state is loaded elsewhere, then goes on from it without a clear or a fetch', () => {
    // Known: the first batch held, whatever its seq, goes on from the state loaded.
    const f = new RankFollower({ replay: true, firstSeq: 0n });
    expect(f.hold()).toEqual([]);
    expect(f.join()).toEqual([]); // no join fetch while held
    expect([7, 8, 9].flatMap((s) => short(live(f, b(s))))).toEqual([]);
    expect(f.inOrderNext).toBeNull();
    expect(short(f.release(true))).toEqual(['a7', 'a8', 'a9']);
    expect(short(live(f, b(10)))).toEqual(['a10']);
    expect(f.inOrderNext).toBe(11n);
    expect(f.counters).toMatchObject({ applied: 4, cleared: 0, unrecoverable: 0 });
    expect(f.unknownBefore).toBe(0n);
    // Known, nothing held: the next live batch goes on from the state.
    const idle = new RankFollower({ replay: false, firstSeq: 0n });
    idle.hold();
    expect(idle.release(true)).toEqual([]);
    expect(short(live(idle, b(40)))).toEqual(['a40']);
    expect(idle.counters.cleared).toBe(0);
    // Not known (no peer answered): the rank joins as it would have, here a gap without replay.
    const lost = new RankFollower({ replay: false, firstSeq: 0n });
    lost.hold();
    live(lost, b(5));
    expect(short(lost.release(false))).toEqual(['c:gap', 'a5']);
    // Held past the bound: cleared, and rebuilt from the first held.
    const over = new RankFollower({ replay: false, firstSeq: 0n, maxHeld: 2 });
    over.hold();
    for (const s of [3, 4, 5]) live(over, b(s));
    expect(short(over.release(true))).toEqual(['c:held_overflow', 'a3', 'a4']);
    expect(over.counters).toMatchObject({ heldDropped: 1, unrecoverable: 1 });
    // A rank already applying is not held; a second release does nothing.
    const on = new RankFollower({ replay: false, firstSeq: 0n });
    live(on, b(0));
    on.hold();
    expect(short(live(on, b(1)))).toEqual(['a1']);
    expect(on.release(true)).toEqual([]);
  });

  it('applies a dense stream from the engine first seq', () => {
    const f = new RankFollower({ replay: true, firstSeq: 0n });
    expect([0, 1, 2].flatMap((s) => short(live(f, b(s))))).toEqual(['a0', 'a1', 'a2']);
    expect(f.lastSeq).toBe(2n);
    expect(f.counters.applied).toBe(3);
  });

  it('joining late fetches from the first seq, holds live batches, and applies them after without duplicates', () => {
    const f = new RankFollower({ replay: true, firstSeq: 0n });
    expect(short(live(f, b(5)))).toEqual(['f0']);
    expect(short(live(f, b(6)))).toEqual([]); // held
    const replayed = [0, 1, 2, 3, 4, 5].flatMap((s) => short(follow(f, f.replayed(fetchId(f), b(s)))));
    expect(replayed).toEqual(['a0', 'a1', 'a2', 'a3', 'a4', 'a5']);
    expect(short(follow(f, f.replayEnded(fetchId(f), true)))).toEqual(['a6']); // 5 was a duplicate of the replay
    expect(f.counters).toMatchObject({ gapsFilled: 1, duplicates: 1, cleared: 0 });
  });

  it('fills a gap from replay, in order before what arrived meanwhile', () => {
    const f = new RankFollower({ replay: true, firstSeq: 0n });
    live(f, b(0));
    expect(short(live(f, b(3)))).toEqual(['f1']);
    live(f, b(4));
    expect([1, 2].flatMap((s) => short(follow(f, f.replayed(fetchId(f), b(s)))))).toEqual(['a1', 'a2']);
    expect(short(follow(f, f.replayEnded(fetchId(f), true)))).toEqual(['a3', 'a4']);
    expect(f.counters.gapsFilled).toBe(1);
  });

  it('clears the rank when the engine no longer has the range, then rebuilds from what follows', () => {
    const f = new RankFollower({ replay: true, firstSeq: 0n });
    live(f, b(0));
    live(f, b(10));
    expect(short(follow(f, f.replayed(fetchId(f), b(7))))).toEqual(['c:gap', 'a7']);
    expect([8, 9, 10].flatMap((s) => short(follow(f, f.replayed(fetchId(f), b(s)))))).toEqual(['a8', 'a9', 'a10']);
    expect(short(follow(f, f.replayEnded(fetchId(f), true)))).toEqual([]);
    expect(f.counters).toMatchObject({ unrecoverable: 1, cleared: 1, gapsFilled: 0 });
  });

  it('without replay a gap clears the rank and is counted', () => {
    const f = new RankFollower({ replay: false, firstSeq: 0n });
    live(f, b(0));
    expect(short(live(f, b(2)))).toEqual(['c:gap', 'a2']);
    expect(f.counters.unrecoverable).toBe(1);
    // Joining late is the same loss: seqs 0..4 of a new follower are gone.
    const late = new RankFollower({ replay: false, firstSeq: 0n });
    expect(short(live(late, b(5)))).toEqual(['c:gap', 'a5']);
    expect(late.counters).toMatchObject({ unrecoverable: 1, cleared: 1, applied: 1 });
    // Its record begins at seq 5: 5 engine batches before it were never seen.
    expect(late.unknownBefore).toBe(5n);
    expect(f.unknownBefore).toBe(2n); // rebuilt from seq 2 after the gap
    // A restart joined from its first seq is whole again.
    live(late, b(0));
    expect(late.unknownBefore).toBe(0n);
  });

  it('a seq falling back is an engine restart: the rank is cleared and the new incarnation joined', () => {
    const f = new RankFollower({ replay: true, firstSeq: 0n });
    for (const s of [0, 1, 2, 3]) live(f, b(s));
    expect(short(live(f, b(0)))).toEqual(['c:restart', 'a0']);
    expect(short(live(f, b(0)))).toEqual(['c:restart', 'a0']);
    live(f, b(1));
    expect(short(live(f, b(0)))).toEqual(['c:restart', 'a0']);
    expect(f.counters.restarts).toBe(3);
    // A restarted engine seen first at seq 2 is joined from its first seq.
    live(f, b(1));
    live(f, b(2));
    expect(short(live(f, b(2)))).toEqual(['c:restart', 'f0']);
  });

  it('a failed fetch, or too many held batches, clears the rank instead of routing on a hole', () => {
    const f = new RankFollower({ replay: true, firstSeq: 0n, maxHeld: 2 });
    live(f, b(0));
    live(f, b(5));
    expect(short(follow(f, f.replayEnded(fetchId(f), false)))).toEqual(['c:gap', 'a5']);
    live(f, b(9));
    live(f, b(10));
    live(f, b(11)); // dropped: over maxHeld
    expect(f.counters.heldDropped).toBe(1);
    expect(short(follow(f, f.replayEnded(fetchId(f), true)))).toEqual(['c:held_overflow', 'a9', 'a10']);
    expect(f.counters.unrecoverable).toBe(2);
  });

  it('live batches that a replay already delivered are duplicates, not a restart', () => {
    const f = new RankFollower({ replay: true, firstSeq: 0n });
    live(f, b(0));
    expect(short(live(f, b(3)))).toEqual(['f1']);
    // The replay runs ahead of the live socket, up to the engine's newest batch.
    expect([1, 2, 3, 4, 5].flatMap((s) => short(follow(f, f.replayed(fetchId(f), b(s)))))).toEqual([
      'a1',
      'a2',
      'a3',
      'a4',
      'a5',
    ]);
    expect(short(follow(f, f.replayEnded(fetchId(f), true)))).toEqual([]);
    // 4 and 5 were queued on the live socket meanwhile: skipped; 6 continues.
    expect([4, 5, 6].flatMap((s) => short(live(f, b(s))))).toEqual(['a6']);
    expect(f.counters).toMatchObject({ restarts: 0, duplicates: 3, gapsFilled: 1, cleared: 0 });
  });

  it("ignores a fetch's replies once a restart has begun another", () => {
    const f = new RankFollower({ replay: true, firstSeq: 0n });
    live(f, b(0));
    live(f, b(5));
    const old = fetchId(f);
    expect(short(live(f, b(2)))).toEqual(['c:restart', 'f0']); // 2 <= 5: the engine restarted
    expect(short(f.replayed(old, b(1)))).toEqual([]);
    expect(short(f.replayEnded(old, true))).toEqual([]);
    expect([0, 1, 2].flatMap((s) => short(follow(f, f.replayed(fetchId(f), b(s)))))).toEqual(['a0', 'a1', 'a2']);
    expect(short(follow(f, f.replayEnded(fetchId(f), true)))).toEqual([]);
  });

  it('join() fetches before any live batch, and an empty join leaves the rank to join by its first batch', () => {
    const f = new RankFollower({ replay: true, firstSeq: 0n });
    expect(short(follow(f, f.join()))).toEqual(['f0']);
    expect([0, 1].flatMap((s) => short(follow(f, f.replayed(fetchId(f), b(s)))))).toEqual(['a0', 'a1']);
    expect(short(follow(f, f.replayEnded(fetchId(f), true)))).toEqual([]);
    expect(short(live(f, b(2)))).toEqual(['a2']);
    const idle = new RankFollower({ replay: true, firstSeq: 0n });
    follow(idle, idle.join());
    expect(short(follow(idle, idle.replayEnded(fetchId(idle), false)))).toEqual([]);
    expect(idle.counters).toMatchObject({ unrecoverable: 0, cleared: 0 });
    expect(short(live(idle, b(0)))).toEqual(['a0']);
    expect(
      short(
        follow(
          new RankFollower({ replay: false, firstSeq: 0n }),
          new RankFollower({ replay: false, firstSeq: 0n }).join(),
        ),
      ),
    ).toEqual([]);
  });

  it('after a reconnect, an older seq is a restart even when no live batch of the old incarnation was seen', () => {
    const joined = () => {
      const f = new RankFollower({ replay: true, firstSeq: 0n });
      follow(f, f.join());
      for (const s of [0, 1, 2]) follow(f, f.replayed(fetchId(f), b(s)));
      follow(f, f.replayEnded(fetchId(f), true));
      return f;
    };
    // Without a reconnect, an older live seq is a duplicate (the replay ran ahead of the socket).
    const a = joined();
    expect(short(live(a, b(1)))).toEqual([]);
    expect(a.counters).toMatchObject({ restarts: 0, duplicates: 1 });
    const c = joined();
    c.reconnected();
    expect(short(live(c, b(0)))).toEqual(['c:restart', 'a0']);
    expect(c.counters).toMatchObject({ restarts: 1, duplicates: 0 });
  });

  it('after a reconnect, fetches from the last seq applied without waiting for a live batch: a gap filled, a restart seen', () => {
    const following = () => {
      const f = new RankFollower({ replay: true, firstSeq: 0n });
      for (const s of [0, 1, 2]) live(f, b(s));
      return f;
    };
    // The engine published 3 and 4 while the socket was down, then went idle: fetched at once.
    const a = following();
    expect(short(follow(a, a.reconnected()))).toEqual(['f2']);
    expect([2, 3, 4].flatMap((s) => short(follow(a, a.replayed(fetchId(a), b(s)))))).toEqual(['a3', 'a4']);
    expect(short(follow(a, a.replayEnded(fetchId(a), true)))).toEqual([]);
    expect(a.counters).toMatchObject({ gapsFilled: 1, duplicates: 1, cleared: 0, restarts: 0 });
    // Nothing new: the last batch comes back, and nothing is counted but that duplicate.
    const n = following();
    follow(n, n.reconnected());
    follow(n, n.replayed(fetchId(n), b(2)));
    expect(short(follow(n, n.replayEnded(fetchId(n), true)))).toEqual([]);
    expect(n.counters).toMatchObject({ gapsFilled: 0, duplicates: 1, cleared: 0, restarts: 0 });
    // Not even the last batch: the engine restarted (an idle one sends no live batch to show it).
    // The rank is cleared and the new incarnation's batches so far are fetched from its first seq.
    const r = following();
    follow(r, r.reconnected());
    expect(short(follow(r, r.replayEnded(fetchId(r), true)))).toEqual(['c:restart', 'f0']);
    expect([0, 1].flatMap((s) => short(follow(r, r.replayed(fetchId(r), b(s)))))).toEqual(['a0', 'a1']);
    expect(short(follow(r, r.replayEnded(fetchId(r), true)))).toEqual([]);
    expect(r.lastSeq).toBe(1n);
    expect(r.counters).toMatchObject({ restarts: 1, cleared: 1 });
    // No answer from the replay socket: nothing is known lost, nothing cleared.
    const q = following();
    follow(q, q.reconnected());
    expect(short(follow(q, q.replayEnded(fetchId(q), false)))).toEqual([]);
    expect(q.counters).toMatchObject({ cleared: 0, unrecoverable: 0 });
    expect(short(live(q, b(3)))).toEqual(['a3']);
    // Without replay (or before anything was applied), a reconnect fetches nothing.
    const w = new RankFollower({ replay: false, firstSeq: 0n });
    live(w, b(0));
    expect(w.reconnected()).toEqual([]);
    expect(new RankFollower({ replay: true, firstSeq: 0n }).reconnected()).toEqual([]);
  });

  it('with resync, state replay cannot restore is loaded whole, then what was held follows it', () => {
    const f = new RankFollower({ replay: true, firstSeq: 0n, resync: true });
    const step = (steps: FollowStep[]) => {
      follow(f, steps);
      return steps.map((x) => (x.kind === 'resync' ? `r:${x.reason}` : short([x])[0]));
    };
    // Joining a node whose log starts at 100: the replay has a hole, so its state is loaded.
    expect(step(f.join())).toEqual(['f0']);
    expect(step(f.replayed(fetchId(f), b(100)))).toEqual(['r:gap']);
    const resync = fetchId(f);
    expect(step(f.replayed(resync - 1, b(101)))).toEqual([]); // the old fetch's replies are ignored
    expect(step(live(f, b(104)))).toEqual([]); // held
    expect(step(live(f, b(105)))).toEqual([]);
    // The state reflects seq 104: 104 is a duplicate, 105 follows.
    expect(step(f.resynced(resync, 104n))).toEqual(['a105']);
    expect(f.counters).toMatchObject({ resynced: 1, cleared: 0, duplicates: 1 });
    // Without replay, a gap is a resync too; a failed load clears the rank as before.
    const g = new RankFollower({ replay: false, firstSeq: 0n, resync: true });
    live(g, b(0));
    const gap = g.live(b(5));
    expect(gap.map((x) => x.kind)).toEqual(['resync']);
    const id = (gap[0] as { fetch: number }).fetch;
    expect(short(g.resyncFailed(id))).toEqual(['c:gap', 'a5']);
    // Loaded again later (the rank holds only what came since the failure), once at a time.
    const again = g.resyncAgain();
    expect(again.map((x) => x.kind)).toEqual(['resync']);
    expect(g.resyncAgain()).toEqual([]);
    expect(short(g.resynced((again[0] as { fetch: number }).fetch, 5n))).toEqual([]);
    expect(new RankFollower({ replay: true, firstSeq: 0n }).resyncAgain()).toEqual([]);
    expect(g.counters).toMatchObject({ unrecoverable: 1, cleared: 1, resynced: 1 });
  });

  it('refuses a replay or a loaded state far ahead of the live stream, and starts over when live batches fall far behind', () => {
    // A replayed seq more than 65,536 ahead of the newest live batch ends its fetch as failed.
    const refused: string[] = [];
    const onRefused = (what: string, seq: bigint) => refused.push(`${what}:${seq}`);
    const h = new RankFollower({ replay: true, firstSeq: 0n, onRefused });
    live(h, b(0));
    expect(short(follow(h, h.live(b(5))))).toEqual(['f1']);
    expect(short(follow(h, h.replayed(fetchId(h), b(1))))).toEqual(['a1']);
    const fetch = fetchId(h);
    expect(short(follow(h, h.replayed(fetch, b(65_542))))).toEqual(['c:gap', 'a5']);
    expect(h.fetchWanted(fetch)).toBe(false);
    expect(refused).toEqual(['replay:65542']);
    expect(h.counters).toMatchObject({ unrecoverable: 1, applied: 3 });
    // At the bound it is taken.
    const k = new RankFollower({ replay: true, firstSeq: 0n, onRefused });
    live(k, b(0));
    follow(k, k.live(b(5)));
    expect(short(follow(k, k.replayed(fetchId(k), b(65_541))))).toEqual(['c:gap', 'a65541']);
    expect(refused).toHaveLength(1);
    const f = new RankFollower({ replay: true, firstSeq: 0n, resync: true, onRefused });
    live(f, b(0));
    // A state loaded as of a seq far ahead counts as a failed load: cleared, and what was held
    // follows (before, every live batch after it was a duplicate).
    const gap = follow(f, f.live(b(5)));
    expect(gap.map((x) => x.kind)).toEqual(['fetch']);
    const lose = follow(f, f.replayed(fetchId(f), b(3))); // 1 and 2 are gone: the state is loaded
    expect(lose.map((x) => x.kind)).toEqual(['resync']);
    expect(short(f.resynced(fetchId(f), 2n ** 62n))).toEqual(['c:gap', 'a5']);
    expect(refused.at(-1)).toBe(`state:${2n ** 62n}`);
    expect(short(live(f, b(6)))).toEqual(['a6']);
    expect(f.counters).toMatchObject({ resynced: 0, duplicates: 0 });
    // Joining, before any live batch, a replay can only be taken as it comes; a live batch far
    // below what it reached is then a new start (as a restart), not a duplicate.
    const g = new RankFollower({ replay: true, firstSeq: 0n });
    expect(short(follow(g, g.join()))).toEqual(['f0']);
    expect(short(follow(g, g.replayed(fetchId(g), b(0))))).toEqual(['a0']);
    expect(short(follow(g, g.replayed(fetchId(g), { seq: 2n ** 62n, payload: Buffer.alloc(1) })))).toEqual([
      'c:gap',
      `a${2n ** 62n}`,
    ]);
    follow(g, g.replayEnded(fetchId(g), true));
    const steps = short(live(g, b(7)));
    expect(steps[0]).toBe('c:restart');
    expect(g.counters).toMatchObject({ restarts: 1, duplicates: 0 });
    expect(g.fetchWanted(fetchId(g))).toBe(steps.includes('f0'));
  });
});
