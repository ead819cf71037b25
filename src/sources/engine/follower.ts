/**
 * One DP rank of an engine's stream, followed by its seqs (docs/protocol.md#engine-sources). It
 * decides, batch by batch, what the relay does: apply it, hold it while a missing range is fetched
 * from the engine's replay socket, or clear the rank because its state is unknown. No I/O here:
 * the source feeds it what arrives and carries out what it answers.
 */

/** A batch as the engine sent it: its seq and its undecoded payload. */
export interface EngineBatch {
  seq: bigint;
  payload: Buffer;
  /** When the relay read it off the live socket (`performance.now()`); absent for replayed ones. */
  receivedAt?: number;
}

/** What the relay does for one rank, in order. */
export type FollowStep =
  | { kind: 'apply'; batch: EngineBatch }
  /** Fetch `from..` from the engine's replay socket, then call `replayed` / `replayEnded` with `fetch`. */
  | { kind: 'fetch'; from: bigint; fetch: number }
  /** The rank's state is unknown: clear it downstream and rebuild from what follows. */
  | { kind: 'clear'; reason: LossReason }
  /**
   * The rank's state is unknown, and the publisher serves it whole (`resync` on): load it, then
   * call `resynced` with the seq it reflects (or `resyncFailed`) with `fetch`. Live batches are
   * held meanwhile.
   */
  | { kind: 'resync'; reason: LossReason; fetch: number };

export type LossReason = 'gap' | 'restart' | 'held_overflow' | 'undecodable';

/**
 * How far a replayed batch or a loaded state may be ahead of the newest live batch: batches in
 * flight between the publisher and this reader (its send queue and this socket's receive queue)
 * are far fewer. Further ahead, it is not this publisher's log, and taking it would make every
 * live batch after it look like a duplicate.
 */
export const AHEAD_OF_LIVE_MAX = 65_536n;

export interface FollowerCounters {
  applied: number;
  /** Gaps filled from the engine's replay. */
  gapsFilled: number;
  /** Gaps the engine could not fill (no replay, or the range is gone): the rank was cleared. */
  unrecoverable: number;
  /** Engine restarts seen (its seq fell back). */
  restarts: number;
  /** Times the rank was cleared downstream. */
  cleared: number;
  /** Duplicates skipped (replay overlapping live batches). */
  duplicates: number;
  /** Live batches dropped because too many were held during a fetch (then the rank is cleared). */
  heldDropped: number;
  /** Times the rank's whole state was loaded from the publisher instead of cleared (`resync`). */
  resynced: number;
}

export interface FollowerOptions {
  /** Whether the engine has a replay socket. */
  replay: boolean;
  /** The engine's first seq (vLLM and SGLang count from 0). */
  firstSeq: bigint;
  /** Live batches held during a fetch before the rank gives up on it. Default 10,000. */
  maxHeld?: number;
  /**
   * The publisher serves its whole state (a kvplane node's `/kv_recover` tree dump): state
   * that replay cannot restore is loaded from it (`resync` steps) instead of cleared. Default false.
   */
  resync?: boolean;
  /** Called after each counter is bumped (recoveries, restarts, clears, ...), as it happens. */
  onCount?: (what: keyof FollowerCounters) => void;
  /**
   * A replayed batch's seq, or the seq a loaded state reflects, refused as further ahead of the
   * live stream than any in flight (`AHEAD_OF_LIVE_MAX`): the fetch or load failed, and why.
   */
  onRefused?: (what: 'replay' | 'state', seq: bigint) => void;
}

export class RankFollower {
  readonly counters: FollowerCounters = {
    applied: 0,
    gapsFilled: 0,
    unrecoverable: 0,
    restarts: 0,
    cleared: 0,
    duplicates: 0,
    heldDropped: 0,
    resynced: 0,
  };
  readonly #opts: Required<Omit<FollowerOptions, 'onRefused'>> & Pick<FollowerOptions, 'onRefused'>;
  /** The seq expected next; `null` before the first batch. */
  #next: bigint | null = null;
  /** Live batches that arrived during a fetch, in arrival order. */
  #held: EngineBatch[] = [];
  #fetching = false;
  #overflowed = false;
  /** The fetch's range had a hole the engine could not fill. */
  #fetchGap = false;
  /** The fetch in progress (its replies are ignored once another has begun). */
  #fetch = 0;
  /** The last seq seen on the live socket: per incarnation it only grows, so one at or below it is a restart. */
  #lastLive: bigint | null = null;
  /** Engine batches before the rank's current record that the relay never saw. */
  #unknownBefore = 0n;
  /** The rank was cleared (or is new): the next batch applied starts its record. */
  #recordStarts = true;
  /** The fetch in progress is `join()`'s (no live batch showed a gap yet). */
  #joining = false;
  /** The live socket reconnected since its last batch: the engine may be a new incarnation. */
  #reconnected = false;
  /**
   * The fetch in progress is `reconnected()`'s, from the last seq applied, and whether any batch
   * of it came (none at all: the engine no longer has that seq, nor any after it).
   */
  #rejoining = false;
  #rejoinSeen = false;
  /** The seq expected next when the rejoin fetch began. */
  #rejoinNext: bigint | null = null;
  /** A `resync` step is in progress (live batches are held, as during a fetch). */
  #resyncing = false;
  /** Live batches are held until `release` (`hold`). */
  #holding = false;
  /** The rank's state before its next batch is known (loaded elsewhere): that batch starts its record without a clear or a fetch. */
  #known = false;

  constructor(opts: FollowerOptions) {
    this.#opts = { maxHeld: 10_000, resync: false, onCount: () => {}, ...opts };
  }

  #count(what: keyof FollowerCounters): void {
    this.counters[what]++;
    this.#opts.onCount(what);
  }

  /** The last seq applied, or `null`. */
  get lastSeq(): bigint | null {
    return this.#next === null ? null : this.#next - 1n;
  }

  get fetching(): boolean {
    return this.#fetching;
  }

  /**
   * The seq expected next when the rank is simply in order: nothing fetched or held, no restart
   * check pending, its record begun. Then batches from it on may be applied by the live socket's
   * reader itself (a native link), which reports them with `appliedElsewhere`. `null` otherwise.
   */
  get inOrderNext(): bigint | null {
    if (this.#fetching || this.#reconnected || this.#recordStarts) return null;
    return this.#next;
  }

  /**
   * Batches up to `lastSeq` (`batches` of them), in order from `inOrderNext`, were applied by the
   * live socket's reader: the rank goes on from there.
   */
  appliedElsewhere(lastSeq: bigint, batches: number): void {
    if (batches === 0) return;
    this.#next = lastSeq + 1n;
    this.#lastLive = lastSeq;
    this.counters.applied += batches;
  }

  /**
   * Engine batches before what the relay holds of this rank that it never saw: 0 when its record
   * reaches back to the engine's first seq (or a restart's), else the seq its record begins at
   * (joined without replay, or rebuilt after a clear), counted from the engine's first seq.
   */
  get unknownBefore(): bigint {
    return this.#unknownBefore;
  }

  /**
   * Fetches what the engine published before the subscription began, without waiting for a live
   * batch to show the gap (a router joining: an idle rank's state is there at once). Nothing when
   * the engine has no replay socket or the rank is already followed.
   */
  join(): FollowStep[] {
    if (!this.#opts.replay || this.#next !== null || this.#fetching) return [];
    this.#joining = true;
    return this.#startFetch(this.#opts.firstSeq, null);
  }

  /**
   * The live socket connected again after losing its connection. If the next live batch is older
   * than what was applied, the engine restarted, even when no live batch of its last incarnation
   * was seen (a rank known only from its replay). And without waiting for one (an idle engine
   * may send none for long): what it published meanwhile is fetched from its replay, from the
   * last seq applied on. An engine keeps its newest batches, so one that answers with none at all,
   * not even that one, has fallen back: it restarted, and the rank starts over
   * (`replayEnded`).
   */
  reconnected(): FollowStep[] {
    this.#reconnected = true;
    const next = this.#next;
    if (!this.#opts.replay || next === null || next <= this.#opts.firstSeq || this.#fetching) return [];
    this.#rejoining = true;
    this.#rejoinSeen = false;
    this.#rejoinNext = next;
    return this.#startFetch(next - 1n, null);
  }

  /**
   * Whether `seq` (a replayed batch's, or the seq a loaded state reflects) is further ahead of
   * the newest live batch than `AHEAD_OF_LIVE_MAX`: then it is refused (the fetch or load fails,
   * `onRefused` says so).
   */
  #aheadOfLive(what: 'replay' | 'state', seq: bigint): boolean {
    const ahead = this.#lastLive !== null && seq > this.#lastLive + AHEAD_OF_LIVE_MAX;
    if (ahead) this.#opts.onRefused?.(what, seq);
    return ahead;
  }

  /** Whether fetch `fetch` is the one in progress (its replies are wanted). */
  fetchWanted(fetch: number): boolean {
    return this.#fetching && !this.#resyncing && !this.#holding && fetch === this.#fetch;
  }

  /**
   * Holds live batches (applies none) until `release`, while the rank's state is loaded from
   * elsewhere (a peer indexer's dump). Nothing when a fetch or load is in progress, or a batch
   * was applied already.
   */
  hold(): FollowStep[] {
    if (this.#fetching || this.#next !== null) return [];
    this.#fetching = true;
    this.#holding = true;
    this.#held = [];
    this.#fetch++;
    return [];
  }

  /**
   * Ends `hold`. `known`: the rank's state up to the first batch held (or the next to arrive)
   * was loaded, so that batch starts its record without a clear or a replay fetch, whatever its
   * seq; otherwise the rank joins as it would have. More held than `maxHeld`: the rank is cleared
   * and rebuilds from the first held batch.
   */
  release(known: boolean): FollowStep[] {
    if (!this.#holding) return [];
    this.#holding = false;
    const held = this.#held;
    this.#held = [];
    if (!this.#fetching) return [];
    this.#fetching = false;
    const steps: FollowStep[] = [];
    if (this.#overflowed) {
      this.#overflowed = false;
      this.#count('unrecoverable');
      steps.push(this.#clear('held_overflow'));
      this.#next = held[0]?.seq ?? null;
    } else if (known && this.#next === null) this.#known = true;
    for (const b of held) steps.push(...this.#continue(b));
    return steps;
  }

  /** A live batch. */
  live(batch: EngineBatch): FollowStep[] {
    const lastLive = this.#lastLive;
    this.#lastLive = batch.seq;
    const reconnected = this.#reconnected;
    this.#reconnected = false;
    // A live batch far below the seq expected is no overlap with a replay (those are bounded by
    // what is in flight): what was applied ahead of it (a replay before any live batch) was not
    // this engine's stream, and the rank starts over as after a restart.
    const farBelow = this.#next !== null && this.#next - batch.seq > AHEAD_OF_LIVE_MAX;
    const fellBack =
      farBelow ||
      (lastLive !== null ? batch.seq <= lastLive : reconnected && this.#next !== null && batch.seq < this.#next);
    if (fellBack) {
      // The live socket's seqs fell back: a new engine incarnation. A fetch in progress is for
      // the old one; its replies are dropped.
      this.#count('restarts');
      this.#fetching = false;
      this.#held = [];
      this.#overflowed = false;
      this.#fetchGap = false;
      this.#resyncing = false;
      this.#holding = false;
      this.#known = false;
      this.#next = null;
      if (this.#opts.resync) return this.#lose('restart', [batch]);
      return [this.#clear('restart'), ...this.#continue(batch)];
    }
    return this.#continue(batch);
  }

  /** A batch in order of arrival (live, or held during a fetch). */
  #continue(batch: EngineBatch): FollowStep[] {
    if (this.#fetching) {
      if (this.#held.length >= this.#opts.maxHeld) {
        this.#count('heldDropped');
        this.#overflowed = true;
      } else this.#held.push(batch);
      return [];
    }
    const next = this.#next;
    if (next === null && this.#known) {
      // Joining a state loaded elsewhere, which stands for every batch before this one: its
      // record reaches back to the engine's first seq.
      this.#known = false;
      this.#recordStarts = false;
      this.#unknownBefore = 0n;
      return this.#apply(batch);
    }
    if (next === null) {
      // Joining: what the engine published before this batch comes from its replay, from its
      // first seq. Without a replay socket it is lost, as any gap is: counted, cleared (visibly
      // downstream, though nothing was applied yet), and the rank rebuilds from here.
      if (batch.seq > this.#opts.firstSeq) {
        if (this.#opts.replay) return this.#startFetch(this.#opts.firstSeq, batch);
        if (this.#opts.resync) return this.#lose('gap', [batch]);
        this.#count('unrecoverable');
        return [this.#clear('gap'), ...this.#apply(batch)];
      }
      return this.#apply(batch);
    }
    if (batch.seq === next) return this.#apply(batch);
    if (batch.seq < next) {
      // Already applied from a replay that ran ahead of the live socket.
      this.#count('duplicates');
      return [];
    }
    if (this.#opts.replay) return this.#startFetch(next, batch);
    if (this.#opts.resync) return this.#lose('gap', [batch]);
    this.#count('unrecoverable');
    this.#next = batch.seq;
    return [this.#clear('gap'), ...this.#apply(batch)];
  }

  /**
   * A batch from the engine's replay, for fetch `fetch`. One far ahead of the live stream ends
   * the fetch as failed (`fetchWanted` is false after it: the rest of its replies are not read).
   */
  replayed(fetch: number, batch: EngineBatch): FollowStep[] {
    if (!this.fetchWanted(fetch)) return [];
    this.#rejoinSeen = true;
    if (this.#aheadOfLive('replay', batch.seq)) return this.replayEnded(fetch, false);
    const next = this.#next ?? this.#opts.firstSeq;
    if (batch.seq < next) {
      this.#count('duplicates');
      return [];
    }
    const steps: FollowStep[] = [];
    if (batch.seq > next) {
      // The engine no longer has `next..batch.seq - 1`. (Resyncing: the rest of this replay is
      // in the state loaded, or held.)
      if (this.#opts.resync) return this.#lose('gap', this.#held);
      this.#fetchGap = true;
      steps.push(this.#clear('gap'));
    }
    this.#next = batch.seq;
    return steps.concat(this.#apply(batch));
  }

  /** Fetch `fetch` ended: the end marker came, or it failed (`ok` false: no answer in time). */
  replayEnded(fetch: number, ok: boolean): FollowStep[] {
    if (!this.fetchWanted(fetch)) return [];
    this.#fetching = false;
    const held = this.#held;
    this.#held = [];
    const steps: FollowStep[] = [];
    const rejoining = this.#rejoining;
    this.#rejoining = false;
    if (rejoining && !ok) {
      // No answer after a reconnect: nothing is known to be lost; the next live batch shows it.
      for (const b of held) steps.push(...this.#continue(b));
      return steps;
    }
    if (rejoining && !this.#rejoinSeen && !this.#fetchGap) {
      // Not even the last seq applied: the engine's seqs fell back while the socket was down.
      // (Its old live seqs say nothing of the new incarnation's.)
      this.#count('restarts');
      this.#next = null;
      this.#lastLive = null;
      this.#reconnected = false;
      this.#overflowed = false;
      if (this.#opts.resync) return this.#lose('restart', held);
      steps.push(this.#clear('restart'));
      // The new incarnation's batches so far, as a join fetches them.
      this.#joining = true;
      steps.push(...this.#startFetch(this.#opts.firstSeq, null));
      this.#held = held;
      return steps;
    }
    const first = held[0];
    const joining = this.#joining;
    this.#joining = false;
    if (joining && this.#next === this.#opts.firstSeq && !this.#fetchGap) {
      // The join fetched nothing (the engine had published nothing, or did not answer): the rank
      // is joined as if it had not fetched, by what arrives next.
      this.#next = null;
      this.#overflowed = false;
      for (const b of held) steps.push(...this.#continue(b));
      return steps;
    }
    const expected = this.#next ?? this.#opts.firstSeq;
    const missing = first !== undefined && first.seq > expected;
    if ((this.#overflowed || missing || !ok) && this.#opts.resync) {
      const reason = this.#overflowed ? 'held_overflow' : 'gap';
      this.#fetching = true;
      return this.#lose(reason, held);
    }
    if (this.#overflowed || missing || !ok) {
      this.#count('unrecoverable');
      steps.push(this.#clear(this.#overflowed ? 'held_overflow' : 'gap'));
      if (first !== undefined) this.#next = first.seq;
    } else if (this.#fetchGap)
      this.#count('unrecoverable'); // cleared when the replay skipped
    else if (!rejoining || this.#next !== this.#rejoinNext) this.#count('gapsFilled'); // not a rejoin that found nothing new
    this.#overflowed = false;
    this.#fetchGap = false;
    for (const b of held) steps.push(...this.#continue(b));
    return steps;
  }

  /** The relay could not apply a batch (undecodable): the rank's state is unknown from here. */
  lost(): FollowStep[] {
    if (this.#opts.resync && !this.#resyncing) return this.#lose('undecodable', this.#held);
    return [this.#clear('undecodable')];
  }

  /**
   * The state `fetch` asked for was loaded, as of seq `lastSeq`: what was held follows it. A
   * `lastSeq` far ahead of the live stream is not this publisher's, and counts as a failed load.
   */
  resynced(fetch: number, lastSeq: bigint): FollowStep[] {
    if (!this.#resyncing || fetch !== this.#fetch) return [];
    if (this.#aheadOfLive('state', lastSeq)) return this.resyncFailed(fetch);
    this.#resyncing = false;
    this.#fetching = false;
    this.#overflowed = false;
    this.#fetchGap = false;
    this.#count('resynced');
    this.#recordStarts = false;
    this.#unknownBefore = 0n;
    this.#next = lastSeq + 1n;
    const held = this.#held;
    this.#held = [];
    return held.flatMap((b) => this.#continue(b));
  }

  /**
   * The publisher's state loaded again (its last load failed, so the rank holds only what came
   * since): a `resync` step, unless a fetch or load is in progress (it comes to the same).
   */
  resyncAgain(): FollowStep[] {
    if (!this.#opts.resync || this.#fetching) return [];
    return this.#lose('gap', []);
  }

  /** Loading the state failed: the rank is cleared and rebuilds from what follows. */
  resyncFailed(fetch: number): FollowStep[] {
    if (!this.#resyncing || fetch !== this.#fetch) return [];
    this.#resyncing = false;
    this.#fetching = false;
    this.#overflowed = false;
    this.#count('unrecoverable');
    const held = this.#held;
    this.#held = [];
    this.#next = held[0]?.seq ?? null;
    return [this.#clear('gap'), ...held.flatMap((b) => this.#continue(b))];
  }

  /** Holds `held` (and what arrives next) while the publisher's whole state is loaded. */
  #lose(reason: LossReason, held: EngineBatch[]): FollowStep[] {
    this.#fetching = true;
    this.#resyncing = true;
    this.#joining = false;
    this.#held = held;
    return [{ kind: 'resync', reason, fetch: ++this.#fetch }];
  }

  #apply(batch: EngineBatch): FollowStep[] {
    if (this.#recordStarts) {
      this.#recordStarts = false;
      this.#unknownBefore = batch.seq > this.#opts.firstSeq ? batch.seq - this.#opts.firstSeq : 0n;
    }
    this.#next = batch.seq + 1n;
    this.#count('applied');
    return [{ kind: 'apply', batch }];
  }

  #startFetch(from: bigint, held: EngineBatch | null): FollowStep[] {
    this.#fetching = true;
    this.#held = held === null ? [] : [held];
    if (this.#next === null) this.#next = from;
    return [{ kind: 'fetch', from, fetch: ++this.#fetch }];
  }

  #clear(reason: LossReason): FollowStep {
    this.#count('cleared');
    this.#recordStarts = true;
    return { kind: 'clear', reason };
  }
}
