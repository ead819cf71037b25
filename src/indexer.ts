import type * as Native from '../index.js';
import type { RecoverAnswer as NativeRecoverAnswer } from '../index.js';
import { type AbortOptions, abortable } from './abort.js';
import type { Dialect, EncodeFormat } from './codec.js';
import { awaitNative, callNative, invalidArg, KvPlaneError, type KvPlaneErrorCode } from './errors.js';
import { columnArgs, type EventColumns, type KvEventBatch, type KvEventBatchOut, type KvEventOut } from './events.js';
import type { HashBlocksOptions } from './hash.js';
import { matchesCount, matchesLayout } from './layout.js';
import native from './native.js';
import { nativeTokens } from './tokens.js';

export interface LocalIndexerOptions {
  /** Tokens per KV block; used to hash `findMatches` token queries. */
  blockSize: number;
  /** This node's worker id; the index's workers are `(workerId, dpRank)`. Default `0n`. */
  workerId?: bigint;
  /**
   * `'content'` (default): blocks are keyed by the chained `xxh3` hash of their tokens, so any
   * engine matches without its hash algorithm. `'engine'`: keyed by the engine's own hashes
   * (hash-only events); token queries are then hashed with `engineHash`.
   */
  keyBy?: 'content' | 'engine';
  /** With `keyBy: 'engine'`: how the engine hashes blocks (its `hashBlocks` options). */
  engineHash?: Omit<HashBlocksOptions, 'blockSize' | 'digests'>;
  /** Keep each block's tokens so tree dumps carry them. Default `true` (engine nodes). */
  retainTokens?: boolean;
  /** Batches kept for replay. Default 10,000 (vLLM's `buffer_steps`). */
  bufferSteps?: number;
  /** This incarnation's epoch. Default: random. */
  epoch?: bigint;
  /**
   * The first batch's seq. Default `1n`; `'clock'` starts above every seq an earlier incarnation
   * can have issued (microseconds since the Unix epoch), so old cursors expire after a restart.
   */
  firstSeq?: bigint | 'clock';
  /** The ZMQ format batches are logged (and replayed) in. Default `'vllm'`. */
  logFormat?: ZmqFormat;
}

/** The ZMQ payload formats kvplane publishes. */
export type ZmqFormat = 'vllm' | 'vllm_legacy' | 'sglang';

/** Logged batches as published: parallel seqs and encoded payloads. */
export interface LoggedBatches {
  seqs: BigUint64Array;
  payloads: Buffer[];
}

/** Where a subscription begins; see `LocalIndexer.cursor`. */
export type SubscribeCursor =
  | { kind: 'live' | 'replay'; start: bigint }
  | { kind: 'expired'; start: bigint; message: string };

/** A `/kv_recover` answer, encoded. */
export interface RecoverAnswer {
  kind: Recovery['kind'];
  body: Buffer;
}

/**
 * A `/kv_recover` answer encoded a chunk (about 1 MiB) at a time off the JS thread: `chunks`
 * yields the next one only when asked, so a sender that waits for its socket to drain between
 * chunks never holds the encoded answer whole. `release()` drops the rest of it.
 */
export interface RecoverChunks {
  kind: Recovery['kind'];
  chunks: AsyncIterableIterator<Buffer>;
  release(): void;
}

/**
 * The index's state as SMG `KvSnapshotChunk` batches (docs/protocol.md#snapshots): `count`
 * chunks numbered `lastSeq - count + 1 ..= lastSeq`, encoded one at a time off the JS thread as
 * `chunks` is read; the live stream continues at `lastSeq + 1`.
 */
export interface Snapshot {
  lastSeq: bigint;
  count: number;
  /** Live blocks in the snapshot. */
  blocks: bigint;
  chunks: AsyncIterableIterator<Buffer>;
  /** Drops the chunks not read yet. */
  release(): void;
}

export interface Worker {
  workerId: bigint;
  dpRank: number;
}

export interface FindMatchesOptions {
  /** Only score these workers. */
  workers?: readonly Worker[];
  /** Stop once at most one candidate is left (its count is then a lower bound). */
  earlyExit?: boolean;
}

/** Per worker holding the first block: parallel arrays, index `i` is one worker. */
export interface Matches {
  workerIds: BigUint64Array;
  dpRanks: Uint32Array;
  /** Consecutive leading blocks of the request the worker holds. */
  blocks: Uint32Array;
  /** Blocks the worker holds in all. */
  treeSizes: BigUint64Array;
}

export interface WorkerEvents {
  workerId: bigint;
  dpRank: number;
  events: KvEventOut[];
}

/** Answers of `getEvents` (docs/protocol.md#http-kv_recover). */
export type Recovery =
  | { kind: 'Events'; batches: KvEventBatchOut[]; lastSeq: bigint; epoch: bigint; nextStart?: bigint }
  | { kind: 'TreeDump'; workers: WorkerEvents[]; lastSeq: bigint; epoch: bigint }
  | { kind: 'TooNew'; lastSeq: bigint; epoch: bigint }
  | { kind: 'InvalidRange'; reason: string; lastSeq: bigint; epoch: bigint };

export interface ApplyResult {
  /** The seq the batch was logged under. */
  seq: bigint;
  /** Events that failed closed (`ERR_UNSUPPORTED_LAYOUT`); their worker was cleared. */
  errors: KvPlaneError[];
}

export interface EncodedApplyResult {
  /** One result per applied batch. */
  batches: ApplyResult[];
  /** Events applied. */
  events: number;
  /** Events of unknown kinds, skipped by the decoder. */
  unknownEvents: number;
}

export interface IndexerStats {
  blocks: number;
  memberships: number;
  workers: number;
  /** Heap bytes of the index, of which `tokenBytes` are retained tokens. */
  bytes: number;
  tokenBytes: number;
  lastSeq: bigint;
  oldestSeq?: bigint;
  retainedBatches: number;
  /** Payload bytes held by the replay log. */
  logBytes: number;
  drops: Record<'unknown_parent' | 'unknown_removed' | 'duplicate_store' | 'unsupported_layout', number>;
  perWorker: Array<{
    workerId: bigint;
    dpRank: number;
    blocks: number;
    unreachableBlocks: number;
    needsRecovery: boolean;
  }>;
}

function randomEpoch(): bigint {
  const b = new BigUint64Array(1);
  crypto.getRandomValues(b);
  return b[0] ?? 1n;
}

/**
 * The engine node's index: a radix tree of cached blocks for every DP rank, the replay log of the
 * last `bufferSteps` batches, and consistent tree dumps.
 */
export class LocalIndexer {
  readonly #native: Native.NativeLocalIndexer;
  readonly #blockSize: number;
  readonly #epoch: bigint;

  constructor(options: LocalIndexerOptions) {
    if (typeof options !== 'object' || options === null) invalidArg('options must be an object');
    const {
      blockSize,
      workerId,
      keyBy = 'content',
      engineHash,
      retainTokens,
      bufferSteps,
      epoch,
      logFormat,
      firstSeq,
    } = options;
    this.#blockSize = blockSize;
    this.#epoch = epoch ?? randomEpoch();
    this.#native = callNative(
      () =>
        new native.NativeLocalIndexer({
          blockSize,
          engineHash: engineHash === undefined ? undefined : ({ ...engineHash, blockSize } as Native.HashBlocksOptions),
          workerId,
          keyBy,
          retainTokens,
          bufferSteps,
          epoch: this.#epoch,
          logFormat,
          firstSeq: firstSeq === 'clock' ? native.clockFirstSeq() : firstSeq,
        }),
    );
  }

  get blockSize(): number {
    return this.#blockSize;
  }

  /** The newest seq (`firstSeq - 1` before the first batch). */
  get lastSeq(): bigint {
    return callNative(() => this.#native.lastSeq);
  }

  /** The oldest seq the replay log retains (`null` while it is empty). */
  get oldestSeq(): bigint | null {
    return callNative(() => this.#native.oldestSeq) ?? null;
  }

  /** This incarnation's epoch (docs/protocol.md#seqs-and-epochs). */
  get epoch(): bigint {
    return this.#epoch;
  }

  /** Applies a batch of events for `(workerId, batch.dpRank ?? 0)` and logs it. */
  applyBatch(batch: KvEventBatch): ApplyResult {
    const r = callNative(() => this.#native.applyBatch(batch));
    return { seq: r.seq, errors: r.errors.map((e) => new KvPlaneError(e.code as KvPlaneErrorCode, e.message)) };
  }

  /**
   * Applies events given as columns (a few typed arrays for many events, no JS object per event)
   * as the next batches of at most 1024 events, each logged under the next seq: what
   * `applyBatch` does for the same events. Throws `ERR_INVALID_ARG` (nothing applied) on
   * inconsistent columns. The arrays are read in place during the call: nothing may write them
   * meanwhile (a `SharedArrayBuffer` a Worker writes to).
   */
  applyColumns(columns: EventColumns, options: { dpRank?: number | null; ts?: number } = {}): ApplyResult[] {
    const ts = options.ts ?? Date.now() / 1000;
    const r = callNative(() => this.#native.applyColumns(...columnArgs(columns), ts, options.dpRank ?? null));
    if (typeof r === 'bigint') return [{ seq: r, errors: [] }];
    return r.map((b) => ({
      seq: b.seq,
      errors: b.errors.map((e) => new KvPlaneError(e.code as KvPlaneErrorCode, e.message)),
    }));
  }

  /**
   * Decodes an engine payload and applies it in one native call (the bulk path: no JS object per
   * event). Each decoded batch is logged under the next seq; a batch of more than 1024 events is
   * split. Throws `ERR_DECODE` (nothing applied) on bytes that are not the dialect.
   */
  applyEncoded(bytes: Uint8Array, dialect: Dialect): EncodedApplyResult {
    const r = callNative(() => this.#native.applyEncoded(bytes, dialect));
    return {
      batches: r.batches.map((b) => ({
        seq: b.seq,
        errors: b.errors.map((e) => new KvPlaneError(e.code as KvPlaneErrorCode, e.message)),
      })),
      events: r.events,
      unknownEvents: r.unknownEvents,
    };
  }

  /**
   * The `/kv_recover` answer for `start..=end` (docs/protocol.md#http-kv_recover) as JSON text bytes or msgpack, with
   * exact u64 integers; built off the JS thread.
   */
  async recover(
    start?: bigint,
    end?: bigint,
    format: 'json' | 'msgpack' = 'json',
    options: AbortOptions = {},
  ): Promise<Buffer> {
    if (format !== 'json' && format !== 'msgpack') invalidArg(`format is ${String(format)}: json or msgpack`);
    return abortable(options.signal, async () => {
      const answer = chunked(await awaitNative(() => this.#native.recover(start, end, format === 'msgpack')));
      return (await joined(answer)).body;
    });
  }

  /**
   * `recover` for the raw `start` / `end` parameters of a `/kv_recover` query (decimal strings,
   * either absent): malformed ones answer `InvalidRange`.
   */
  async recoverQuery(
    start?: string,
    end?: string,
    format: 'json' | 'msgpack' = 'json',
    options: AbortOptions = {},
  ): Promise<RecoverAnswer> {
    return abortable(options.signal, async () => joined(await this.recoverQueryChunks(start, end, format)));
  }

  /** `recoverQuery` as chunks encoded one at a time (what `/kv_recover` sends). */
  async recoverQueryChunks(start?: string, end?: string, format: 'json' | 'msgpack' = 'json'): Promise<RecoverChunks> {
    if (format !== 'json' && format !== 'msgpack') invalidArg(`format is ${String(format)}: json or msgpack`);
    return chunked(await awaitNative(() => this.#native.recoverQuery(start, end, format === 'msgpack')));
  }

  /**
   * Logged batches from `start` as they were published (the oldest retained if `start` is older,
   * as vLLM's replay does), at most `max` of them; with `'smg_proto'`, re-encoded as the same
   * `KvEventBatch` bytes the gRPC stream carried.
   */
  replay(start: bigint, max: number, format?: 'smg_proto'): LoggedBatches {
    return callNative(() => this.#native.replay(start, max, format));
  }

  /**
   * Where a gRPC subscription from `start` begins (docs/protocol.md#seqs-and-epochs): `live` (0), `replay` from `start`
   * (within the log, or the next seq), or `expired` with the status message for the consumer.
   */
  cursor(start: bigint): SubscribeCursor {
    const c = callNative(() => this.#native.cursor(start));
    return c.kind === 'expired'
      ? { kind: 'expired', start: c.start, message: c.message ?? '' }
      : { kind: c.kind as 'live' | 'replay', start: c.start };
  }

  /**
   * Whether batches published from now on are also encoded, once each, in `format` (`smg_proto`:
   * SMG protobuf `KvEventBatch`es for gRPC subscribers), as one more entry of a drain's
   * `encodings`.
   * @internal
   */
  setFormat(format: EncodeFormat, on: boolean): void {
    callNative(() => this.#native.setFormat(format, on));
  }

  /**
   * Publishes up to `maxEvents` events of a publish queue: they leave the queue at once; on a
   * worker thread they are packed into batches of at most 1024 events, each applied, encoded once
   * and logged under the next seq (a seq is skipped where the queue lost events). Used by
   * `KvEventPublisher`.
   * @internal
   */
  drainAsync(
    queue: Native.NativeEventQueue,
    maxEvents: number,
    ts: number,
    dpRank: number | null,
  ): Promise<Native.PublishedOut> {
    return awaitNative(() => this.#native.drainAsync(queue, maxEvents, ts, dpRank));
  }

  /**
   * Relays an engine's consecutive payloads from DP rank `dpRank`: decoded, applied, encoded once
   * per format and logged in Rust, consecutive batches of one rank published as one under the
   * next seq. Used by `KvEventStream.relay`.
   * @internal
   */
  relayCoalesced(payloads: readonly Uint8Array[], dialect: Dialect, dpRank: number | null): Native.PublishedOut {
    const bufs = payloads.map((b) => (Buffer.isBuffer(b) ? b : Buffer.from(b.buffer, b.byteOffset, b.byteLength)));
    return callNative(() => this.#native.relayCoalesced(bufs, dialect, dpRank));
  }

  /**
   * `relayCoalesced` for a payload whose events carry the engine's event ids, under the payload's
   * ranks: `ranks[i]` expects id `nextIds[i]` next, and a batch that does not follow is preceded
   * by a clear of its rank. Used by `KvEventStream.relayWithEventIds`.
   * @internal
   */
  relayWithEventIds(
    bytes: Uint8Array,
    dialect: Dialect,
    ranks: Int32Array,
    nextIds: BigUint64Array,
  ): Native.RelayedIdsOut {
    const buf = Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    return callNative(() => this.#native.relayWithEventIds(buf, dialect, ranks, nextIds));
  }

  /** Publishes `AllBlocksCleared` for `dpRank` as the next batch. Used by `KvEventStream.clearRank`. @internal */
  clearRank(dpRank: number | null, ts: number): Native.PublishedOut {
    return callNative(() => this.#native.clearRank(dpRank, ts));
  }

  /**
   * Relays an engine rank's live socket on the native link thread (crates/kvplane-zmq): batches
   * the gate lets through are decoded, applied, encoded and logged there and kept for
   * `takeDeferred` (`onPublished` says so); `onDelivery` gets the rest. Used by `KvEventStream`.
   * @internal
   */
  followZmq(
    opts: Native.EngineLinkOptions,
    onDelivery: (d: Native.ZmqDeliveryOut) => void,
    onPublished: () => void,
  ): Native.NativeZmqLink {
    return callNative(() => this.#native.followZmq(opts, onDelivery, onPublished));
  }

  /** The batches published on link threads since last taken, in seq order, encoded in `formats` only. @internal */
  takeDeferred(formats: readonly EncodeFormat[]): Native.PublishedOut {
    return callNative(() => this.#native.takeDeferred([...formats]));
  }

  /**
   * Binds a native PUB that sends every batch logged from now on as `[topic, seq, payload]`;
   * `null` for an endpoint it does not bind. Used by the ZMQ transport. @internal
   */
  bindZmqLive(endpoint: string, topic: string, hwm: number): Native.NativeZmqPublisher | null {
    return callNative(() => this.#native.bindZmqLive(endpoint, topic, hwm));
  }

  /**
   * Per worker, how many consecutive leading blocks of a request it holds. The request is its
   * tokens (hashed here into the index's keys) or already its chained block hashes.
   */
  findMatches(
    query: Uint32Array | readonly number[] | { seqHashes: BigUint64Array },
    options: FindMatchesOptions = {},
  ): Matches {
    let q: Uint32Array | BigUint64Array | Float64Array;
    if (query instanceof Uint32Array || Array.isArray(query)) q = nativeTokens(query, 'query');
    else if (
      typeof query === 'object' &&
      query !== null &&
      'seqHashes' in query &&
      query.seqHashes instanceof BigUint64Array
    )
      q = query.seqHashes;
    else invalidArg('query must be tokens (Uint32Array or number[]) or { seqHashes: BigUint64Array }');
    const { workers, earlyExit } = options;
    const packed = callNative(() =>
      this.#native.findMatches(
        q,
        workers?.map((w) => w.workerId),
        workers?.map((w) => w.dpRank),
        earlyExit,
      ),
    );
    const count = matchesCount(packed.length);
    const at = matchesLayout(count);
    const buf = packed.buffer;
    const base = packed.byteOffset;
    return {
      workerIds: new BigUint64Array(buf, base + at.workerIds, count),
      treeSizes: new BigUint64Array(buf, base + at.treeSizes, count),
      dpRanks: new Uint32Array(buf, base + at.dpRanks, count),
      blocks: new Uint32Array(buf, base + at.blocks, count),
    };
  }

  /** Recovery for batches `start..=end` (docs/protocol.md#http-kv_recover): `Events`, `TreeDump`, `TooNew` or `InvalidRange`. */
  getEvents(start?: bigint, end?: bigint): Recovery {
    return callNative(() => this.#native.getEvents(start, end)) as Recovery;
  }

  /**
   * The index's state for a gRPC subscriber without a usable cursor, at most `maxBlocks` blocks
   * per chunk (docs/protocol.md#snapshots), taken off the JS thread; `null` when nothing was
   * published yet. `unknownBefore` gives, per DP rank, the engine batches before the relay's
   * record of it that it never saw (`KvSnapshotChunk.unknown_before`).
   */
  async snapshot(maxBlocks: number, unknownBefore?: ReadonlyMap<number, bigint>): Promise<Snapshot | null> {
    if (!Number.isInteger(maxBlocks) || maxBlocks < 1 || maxBlocks > 0xffffffff) {
      invalidArg(`maxBlocks must be a positive integer, got ${maxBlocks}`);
    }
    const ranks = [...(unknownBefore?.keys() ?? [])];
    const counts = BigUint64Array.from(ranks, (r) => unknownBefore?.get(r) ?? 0n);
    const s = await awaitNative(() => this.#native.snapshot(maxBlocks, Date.now() / 1000, ranks, counts));
    if (s === null) return null;
    const rest = s.chunks;
    return {
      lastSeq: s.lastSeq,
      count: s.count,
      blocks: s.blocks,
      chunks: nativeChunks(rest),
      release: () => rest.release(),
    };
  }

  /** A consistent snapshot of the whole index as stored events, built off the JS thread. */
  async dumpTree(options: AbortOptions = {}): Promise<Extract<Recovery, { kind: 'TreeDump' }>> {
    return (await abortable(options.signal, () => awaitNative(() => this.#native.dumpTree()))) as Extract<
      Recovery,
      { kind: 'TreeDump' }
    >;
  }

  stats(): IndexerStats {
    const s = callNative(() => this.#native.stats());
    const drops = Object.fromEntries(s.drops.map((d) => [d.reason, d.count])) as IndexerStats['drops'];
    return { ...s, drops };
  }

  /** Frees the index; later calls throw `ERR_CLOSED`. */
  close(): void {
    this.#native.close();
  }

  get closed(): boolean {
    return this.#native.closed;
  }

  [Symbol.dispose](): void {
    this.close();
  }
}

/** The native answer's first chunk and the handle for the rest, as `RecoverChunks`. */
function chunked(r: NativeRecoverAnswer): RecoverChunks {
  const rest = r.rest ?? null;
  async function* chunks(): AsyncGenerator<Buffer> {
    yield r.body;
    if (rest !== null) yield* nativeChunks(rest);
  }
  return { kind: r.kind as Recovery['kind'], chunks: chunks(), release: () => rest?.release() };
}

/** The chunks a native encoder hands out one `next()` at a time, released when done or abandoned. */
async function* nativeChunks(source: { next(): Promise<Buffer | null>; release(): void }): AsyncGenerator<Buffer> {
  try {
    for (let c = await awaitNative(() => source.next()); c !== null; c = await awaitNative(() => source.next()))
      yield c;
  } finally {
    source.release();
  }
}

async function joined(answer: RecoverChunks): Promise<RecoverAnswer> {
  const parts: Buffer[] = [];
  for await (const c of answer.chunks) parts.push(c);
  return { kind: answer.kind, body: parts.length === 1 ? (parts[0] as Buffer) : Buffer.concat(parts) };
}
