import type { Client, ClientReadableStream, Metadata, ServiceError } from '@grpc/grpc-js';
import { grpcJs } from '../../optional.js';
import { keepaliveOptions } from '../../transports/grpc/keepalive.js';
import { encodeSubscribeRequest, subscribePath } from '../../transports/grpc/services.js';
import { status, statusName } from '../../transports/grpc/status.js';
import { checkCount, INT32_MAX, MAX_FRAME_BYTES } from '../../transports/zmq/config.js';
import {
  appliedSoTrimLater,
  Backoff,
  emptyRecoveries,
  type RecoveryKind,
  type RouterTarget,
  type Subscription,
  type SubscriptionStats,
} from './subscription.js';

export interface GrpcSubscriptionOptions {
  workerId: bigint;
  /** `HOST:PORT` of a kvplane node's gRPC server, or of any server of SMG's `SubscribeKvEvents`. */
  address: string;
  /** The service to call it on. Default `vllm.grpc.engine.VllmEngine` (kvplane serves every one). */
  service?: string;
  /** Bearer token, for a node started with one. */
  token?: string;
  /** Rank for batches that name none. Default 0. */
  dpRank?: number;
  onWarning?: (msg: string, detail: Record<string, unknown>) => void;
  /** Each recovery as it happens. */
  onRecovered?: (kind: RecoveryKind) => void;
  /**
   * HTTP/2 pings this often, and a connection whose ping is not answered within 10 s (or this, if
   * shorter) is dropped and followed again: a node that hangs or is cut off is noticed, where a
   * quiet stream alone says nothing. Default 300,000 ms, what a grpcio server (Python) allows
   * with its default settings on a stream it sends nothing on (more often, it ends the connection
   * with GOAWAY `too_many_pings`). A kvplane node's server takes any rate: `kvplane indexer`
   * pings the nodes it found by URL every 30 s.
   */
  keepaliveMs?: number;
  /** The largest message taken from the node. Default 256 MiB (as the native ZMQ link's frames). */
  maxMessageBytes?: number;
  /**
   * A snapshot whose next chunk does not come within this many ms is given up: the stream is
   * opened again from 0 after the backoff. Default 30,000 (a node sends its chunks back to back).
   */
  snapshotStallMs?: number;
}

const raw = (b: Buffer) => b;
const EPOCH_KEY = 'x-kvplane-epoch';
const DEFAULT_KEEPALIVE_MS = 300_000;
/**
 * A stream that lived this long before it ended counts as a success: the next one opens at once
 * when it can resume (and the backoff starts over). One that ends sooner waits the backoff, so a
 * node that ends, refuses or breaks every stream at once is not called in a loop.
 */
const STABLE_STREAM_MS = 5000;
/** How long a resumed call must stand on a connected channel to count as live without headers. */
const RESUME_SETTLE_MS = 500;
const DEFAULT_SNAPSHOT_STALL_MS = 30_000;

/** A kvplane node's epoch (a u64 in decimal), or `undefined` for anything else. */
function parseEpoch(v: string): bigint | undefined {
  if (!/^\d{1,20}$/.test(v)) return undefined;
  const n = BigInt(v);
  return n < 2n ** 64n ? n : undefined;
}

/**
 * A worker followed over gRPC `SubscribeKvEvents` (docs/architecture.md#router-side). Joining, it
 * subscribes from 0: the node sends its state as snapshot chunks (each rank's first begins with
 * its clear), then live batches. After a lost stream it resumes from the last applied seq + 1 on
 * the same epoch; an expired cursor (`OUT_OF_RANGE`) or another epoch (the node restarted)
 * starts over from 0, the worker's state dropped when the new snapshot's first batch arrives. A
 * seq gap on the stream reopens it from the missing seq.
 */
export class GrpcSubscription implements Subscription {
  readonly workerId: bigint;
  readonly dpRank: number;
  readonly #o: GrpcSubscriptionOptions;
  readonly #target: RouterTarget;
  readonly #client: Client;
  readonly #backoff = new Backoff();
  #call: ClientReadableStream<Buffer> | null = null;
  #timer: NodeJS.Timeout | null = null;
  /** Armed while a snapshot has chunks to come (`snapshotStallMs`). */
  #stallTimer: NodeJS.Timeout | null = null;
  readonly #snapshotStallMs: number;
  #closed = false;
  /** Starting over: the worker is cleared before the first batch of the new stream is applied. */
  #fresh = true;
  #clearPending = false;
  /** The last batch applied was a snapshot chunk with more of its snapshot to come. */
  #inSnapshot = false;
  /** When the current stream was opened (`STABLE_STREAM_MS`), and from which seq. */
  #openedAt = 0;
  #openedFrom = 0n;
  readonly #stats: SubscriptionStats;

  constructor(target: RouterTarget, o: GrpcSubscriptionOptions) {
    this.#target = target;
    this.#o = o;
    this.workerId = o.workerId;
    this.dpRank = o.dpRank ?? 0;
    const grpc = grpcJs();
    this.#snapshotStallMs = checkCount('snapshotStallMs', o.snapshotStallMs ?? DEFAULT_SNAPSHOT_STALL_MS, INT32_MAX);
    this.#client = new grpc.Client(o.address, grpc.credentials.createInsecure(), {
      'grpc.max_receive_message_length': checkCount('maxMessageBytes', o.maxMessageBytes ?? MAX_FRAME_BYTES, INT32_MAX),
      'grpc.initial_reconnect_backoff_ms': 100,
      'grpc.max_reconnect_backoff_ms': 5000,
      ...keepaliveOptions(o.keepaliveMs ?? DEFAULT_KEEPALIVE_MS),
    });
    this.#stats = {
      workerId: o.workerId,
      dpRank: this.dpRank,
      kind: 'grpc',
      endpoint: o.address,
      state: 'connecting',
      lastSeq: null,
      epoch: null,
      batches: 0,
      events: 0,
      lastBatchAt: null,
      recoveries: emptyRecoveries(),
      restarts: 0,
      reconnects: 0,
      duplicates: 0,
      undecodable: 0,
      dropped: 0,
      malformed: 0,
      linkBatches: 0,
      lastError: null,
    };
  }

  start(): void {
    this.#open();
  }

  stats(): SubscriptionStats {
    return { ...this.#stats, recoveries: { ...this.#stats.recoveries } };
  }

  async stop(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#stats.state = 'closed';
    if (this.#timer) clearTimeout(this.#timer);
    this.#watchSnapshot(null);
    this.#call?.cancel();
    this.#call = null;
    this.#client.close();
  }

  #open(): void {
    if (this.#closed) return;
    this.#openedAt = Date.now();
    const s = this.#stats;
    // A stream lost in the middle of a snapshot starts over: the chunks' seqs are the log's, so
    // resuming after the last chunk applied would lay live history over a partial state.
    const from = this.#fresh || this.#inSnapshot || s.lastSeq === null ? 0n : s.lastSeq + 1n;
    if (from === 0n) {
      this.#fresh = true;
      this.#clearPending = true;
      this.#inSnapshot = false;
    }
    this.#openedFrom = from;
    s.state = from === 0n ? 'recovering' : 'connecting';
    const md = new (grpcJs().Metadata)();
    if (this.#o.token) md.set('authorization', `Bearer ${this.#o.token}`);
    const path = subscribePath(this.#o.service ?? 'vllm.grpc.engine.VllmEngine');
    const call = this.#client.makeServerStreamRequest(path, raw, raw, encodeSubscribeRequest(from), md, {});
    this.#call = call;
    call.on('metadata', (m: Metadata) => {
      if (this.#call !== call) return;
      const v = m.get(EPOCH_KEY)[0];
      let epoch = v === undefined ? null : parseEpoch(v.toString());
      if (epoch === undefined) {
        // Not a kvplane node's epoch: followed as a server that sends none (SMG's own), and said.
        s.lastError = `malformed ${EPOCH_KEY} header ignored: ${JSON.stringify(v?.toString().slice(0, 64))}`;
        this.#warn('malformed epoch header ignored', { value: v?.toString().slice(0, 64) });
        epoch = null;
      }
      if (epoch !== null && s.epoch !== null && epoch !== s.epoch) {
        s.restarts++;
        this.#o.onRecovered?.('restart');
        if (from !== 0n) {
          // The node restarted: this cursor means nothing to it. Start over from its snapshot.
          s.epoch = epoch;
          this.#restartFromSnapshot(call, 'node restarted (epoch changed)', 'now');
          return;
        }
      }
      if (epoch !== null) s.epoch = epoch;
      if (from !== 0n && s.state === 'connecting') this.#resumed();
    });
    if (from !== 0n) this.#liveOnceConnected(call);
    call.on('data', (buf: Buffer) => this.#batch(call, buf));
    call.on('error', (err: ServiceError) => this.#failed(call, err));
    call.on('end', () => {
      if (this.#call === call) this.#retry('stream ended', 'resume');
    });
  }

  #resumed(): void {
    this.#stats.recoveries.resume++;
    this.#o.onRecovered?.('resume');
    this.#stats.state = 'live';
  }

  /**
   * A resumed stream counts as live once its channel is connected and the call still stands,
   * whether or not the server has sent anything: a grpcio server sends its headers with its first
   * message, so a quiet one would otherwise show as connecting until its next batch.
   */
  #liveOnceConnected(call: ClientReadableStream<Buffer>): void {
    const check = () => {
      if (this.#call !== call || this.#stats.state !== 'connecting') return;
      const ready = this.#client.getChannel().getConnectivityState(false) === grpcJs().connectivityState.READY;
      if (ready) this.#resumed();
      else setTimeout(check, RESUME_SETTLE_MS).unref();
    };
    setTimeout(check, RESUME_SETTLE_MS).unref();
  }

  #batch(call: ClientReadableStream<Buffer>, buf: Buffer): void {
    if (this.#call !== call) return;
    const s = this.#stats;
    if (this.#clearPending) {
      this.#target.clearWorker(this.workerId);
      this.#clearPending = false;
      s.recoveries.snapshot++;
      this.#o.onRecovered?.('snapshot');
    }
    let r: { outcome: string; seq: bigint; events: number; snapshotRest: number };
    try {
      r = this.#target.applyNumbered(this.workerId, this.dpRank, buf, this.#fresh ? null : (s.lastSeq ?? -1n) + 1n);
    } catch (err) {
      // Undecodable: what this worker holds is unknown from here. Rebuild it.
      s.undecodable++;
      this.#restartFromSnapshot(call, `undecodable batch: ${(err as Error).message}`);
      return;
    }
    if (r.outcome === 'duplicate') {
      s.duplicates++;
      return;
    }
    if (r.outcome === 'gap') {
      this.#warn('seq gap on the stream; resubscribing from the missing seq', { expected: s.lastSeq, got: r.seq });
      this.#call = null;
      call.cancel();
      this.#retry('gap', 'resume');
      return;
    }
    this.#fresh = false;
    this.#inSnapshot = r.snapshotRest > 0;
    s.lastSeq = r.seq;
    s.batches++;
    s.events += r.events;
    s.lastBatchAt = Date.now();
    // Until its snapshot's last chunk, what the worker holds is not yet the node's state.
    s.state = this.#inSnapshot ? 'recovering' : 'live';
    this.#watchSnapshot(this.#inSnapshot ? call : null);
    appliedSoTrimLater();
  }

  /**
   * With a call, (re)arms the stall timer for its snapshot's next chunk; with `null`, disarms it.
   * A node that stops in the middle of a snapshot on a connection that stays up (keepalive sees
   * nothing wrong) would otherwise leave the worker half-built and `recovering` for good.
   */
  #watchSnapshot(call: ClientReadableStream<Buffer> | null): void {
    if (this.#stallTimer) clearTimeout(this.#stallTimer);
    this.#stallTimer = null;
    if (call === null) return;
    this.#stallTimer = setTimeout(() => {
      this.#stallTimer = null;
      if (this.#call !== call || !this.#inSnapshot) return;
      this.#restartFromSnapshot(call, `snapshot stalled: no chunk for ${this.#snapshotStallMs} ms`, 'backoff');
    }, this.#snapshotStallMs);
    this.#stallTimer.unref();
  }

  /**
   * Starts over from 0 (`now`: a resumed stream's node restarted, the stream from 0 cannot again;
   * `backoff`: a stream from 0 that went wrong may again).
   */
  #restartFromSnapshot(
    call: ClientReadableStream<Buffer>,
    why: string,
    when: 'now' | 'resume' | 'backoff' = 'resume',
  ): void {
    this.#warn('rebuilding the worker from a snapshot', { reason: why });
    this.#fresh = true;
    this.#call = null;
    call.cancel();
    this.#retry(why, when);
  }

  #failed(call: ClientReadableStream<Buffer>, err: ServiceError): void {
    if (this.#call !== call) return;
    const s = this.#stats;
    s.lastError = `${statusName(err.code)}: ${err.details}`;
    if (err.code === status.OUT_OF_RANGE) {
      // Expired cursor: the node's log no longer reaches back to it (a restarted node's never
      // does). From 0 at once: a node that refuses 0 too backs off.
      this.#fresh = true;
      this.#retry(s.lastError, this.#openedFrom !== 0n ? 'now' : 'resume');
    } else if (err.code === status.RESOURCE_EXHAUSTED) {
      // Cut off for lagging (or the node full): resume where it stopped.
      this.#retry(s.lastError, 'resume');
    } else {
      this.#retry(s.lastError, 'backoff');
    }
  }

  /**
   * Opens the stream again. `now`: at once (a resumed stream the node answered it must start
   * over; the stream from 0 cannot be answered so again). `resume`: at once if the stream that
   * ended had lived `STABLE_STREAM_MS`, else after the backoff. `backoff`: after the backoff
   * (100 ms doubling to 5 s; started over after a stable stream).
   */
  #retry(why: string, when: 'now' | 'resume' | 'backoff'): void {
    this.#call = null;
    this.#watchSnapshot(null);
    if (this.#closed) return;
    const stable = Date.now() - this.#openedAt >= STABLE_STREAM_MS;
    if (stable) this.#backoff.reset();
    const delayMs = when === 'now' || (when === 'resume' && stable) ? 0 : this.#backoff.delay();
    this.#stats.lastError = why;
    this.#stats.reconnects++;
    this.#stats.state = 'backoff';
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = setTimeout(() => {
      this.#timer = null;
      this.#open();
    }, delayMs);
    if (delayMs > 0) this.#warn('stream lost; reconnecting', { reason: why, delay_ms: Math.round(delayMs) });
  }

  #warn(msg: string, detail: Record<string, unknown>): void {
    this.#o.onWarning?.(msg, { worker_id: this.workerId, address: this.#o.address, ...detail });
  }
}
