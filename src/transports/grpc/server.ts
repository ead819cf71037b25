import { EventEmitter } from 'node:events';
import type {
  Metadata,
  MethodDefinition,
  Server,
  ServerUnaryCall,
  ServerWritableStream,
  ServiceDefinition,
  ServiceError,
  sendUnaryData,
} from '@grpc/grpc-js';
import { type AbortOptions, openAbortable, runThenAbortable } from '../../abort.js';
import { bindOrThrow, KvPlaneError } from '../../errors.js';
import type { Snapshot } from '../../indexer.js';
import { grpcJs } from '../../optional.js';
import type { EncodedBatches } from '../../stream/batches.js';
import type { KvEventStream } from '../../stream/stream.js';
import { bearerMatches } from '../auth.js';
import { idleConnectionMs } from '../idle.js';
import { checkCount, INT32_MAX, MAX_FRAME_BYTES } from '../zmq/config.js';
import { ENGINE_METHODS, type EngineMethod } from './engine_methods.js';
import { keepaliveOptions } from './keepalive.js';
import { EngineLoadPoller, type LoadPollStats } from './loads.js';
import { decodeSubscribeRequest, encodeHealthResponse, KV_EVENT_SERVICES, rawMethod } from './services.js';
import { status } from './status.js';
import { type EndStatus, Subscriber } from './subscriber.js';
import { type AnyHandler, GrpcUpstream } from './upstream.js';

/** `SubscribeKvEvents` on a service kvplane knows no other RPC of. */
const SUBSCRIBE_METHOD: EngineMethod = { name: 'SubscribeKvEvents', requestStream: false, responseStream: true };

/** PEM material for TLS on the gRPC port. */
export interface GrpcTlsOptions {
  cert: string | Buffer;
  key: string | Buffer;
  /** CA bundle: when given, clients must present a certificate it signed. */
  ca?: string | Buffer;
}

export interface KvGrpcServerOptions {
  /** The stream to serve; `null` serves no events (`SubscribeKvEvents` answers UNIMPLEMENTED). */
  stream: KvEventStream | null;
  /** Default `0.0.0.0` (routers connect from other hosts). */
  host?: string;
  /** Default 0 (the OS picks; read `port`). */
  port?: number;
  /** When set, every call must carry `authorization: Bearer <token>` (else UNAUTHENTICATED). */
  authToken?: string;
  /** Serve TLS instead of plaintext. */
  tls?: GrpcTlsOptions;
  /**
   * A connection with no call open this long is closed (GOAWAY; clients reconnect when they next
   * call). A connection that never sends a call counts too: without it, peers that connect and
   * say nothing would hold the process's file descriptors until it ran out. Default 300,000 ms
   * (5 min: a gateway's unary calls a few seconds or minutes apart keep their connection).
   */
  idleConnectionMs?: number;
  /**
   * Every connection is pinged (HTTP/2 PING) this often, and one whose ping is not answered within
   * 10 s (or this, if shorter) is closed, its calls ended UNAVAILABLE: a peer gone without closing
   * its TCP connection, or a connection Node's HTTP/2 stops reading (Node 20 and 22 do on a
   * request header field over 64 KB, which stalled every call on that connection until its
   * deadline). Default 30,000 ms.
   */
  keepaliveMs?: number;
  /**
   * Batches a subscriber may fall behind before it is cut off with RESOURCE_EXHAUSTED (it
   * resumes by resubscribing from its last seq). Default 1024.
   */
  maxLagBatches?: number;
  /**
   * Blocks per `KvSnapshotChunk` sent to a subscriber from 0 (docs/protocol.md#snapshots).
   * Default 4096 (about 200 KB per chunk with 16-token blocks).
   */
  snapshotChunkBlocks?: number;
  /**
   * Snapshots in progress at once (each holds a copy of the index until it is sent and its
   * subscriber has caught up). A subscriber from 0 beyond them waits, its stream open, until one
   * ends. Default 4.
   */
  maxSnapshots?: number;
  /**
   * Open `SubscribeKvEvents` streams at most; one more is refused with RESOURCE_EXHAUSTED
   * (counted, outcome `full`). Each open stream holds up to its lag in memory. Default 1024.
   */
  maxSubscribers?: number;
  /**
   * Engine services to register (`SubscribeKvEvents`, `HealthCheck` and, with `upstream`, every
   * other RPC). Default: all of `KV_EVENT_SERVICES`.
   */
  services?: readonly string[];
  /**
   * The engine's own gRPC server, `HOST:PORT` (docs/protocol.md#grpc-upstream): every RPC kvplane
   * does not serve is forwarded to it, `HealthCheck` included while kvplane itself is healthy.
   */
  upstream?: string;
  /**
   * Per DP rank, the engine batches before the relay's record of it that it never saw, sent as
   * `unknown_before` in snapshot chunks (a relay that joined an engine without replay). Default
   * none.
   */
  unknownBefore?: () => ReadonlyMap<number, bigint>;
  /**
   * What else `HealthCheck` depends on (the node's source). The server is unhealthy anyway while
   * its stream is closed or failed closed.
   */
  health?: () => { healthy: boolean; message: string };
  /**
   * With `upstream`: how often the engine's `GetLoads` is polled for the load records the streams
   * carry (docs/protocol.md#load-records), in ms. Default 1000; 0 sends no records.
   */
  loadPollMs?: number;
}

export interface GrpcStats {
  /** Open `SubscribeKvEvents` streams. */
  subscribers: number;
  /** Subscriptions by how they began or were refused. */
  subscribes: {
    /** From 0: the index's state as snapshot chunks, then live. */
    snapshot: number;
    /** From 0 while `maxSnapshots` were in progress: waited for one to end. */
    snapshotBusy: number;
    replay: number;
    expired: number;
    unimplemented: number;
    unauthenticated: number;
    invalid: number;
    failClosed: number;
    /** Refused: `maxSubscribers` streams were open. */
    full: number;
  };
  /** Snapshots being streamed or waiting for a turn (at most `maxSnapshots` run at once). */
  snapshotsPending: number;
  /** Subscribers cut off for falling behind (RESOURCE_EXHAUSTED). */
  cutOff: number;
  /** Batches handed to subscriber streams (live and replayed). */
  batchesSent: number;
  /** The most batches any subscriber has waiting (its lag). */
  maxLag: number;
  /** Bytes queued in kvplane for all subscribers (each bounded by its lag cut-off). */
  queuedBytes: number;
  /** `load_only` batches sent (the engine's load between batches). */
  loadOnlySent: number;
  /** The engine's `GetLoads` polls, with an upstream. */
  loads: LoadPollStats | null;
}

/** gRPC's standard health service, and its unary check. */
const STANDARD_HEALTH = 'grpc.health.v1.Health';
const STANDARD_HEALTH_CHECK = `/${STANDARD_HEALTH}/Check`;

const DEFAULT_MAX_LAG = 1024;
const DEFAULT_SNAPSHOT_CHUNK_BLOCKS = 4096;
const DEFAULT_MAX_SNAPSHOTS = 4;
const DEFAULT_MAX_SUBSCRIBERS = 1024;
const DEFAULT_IDLE_CONNECTION_MS = 300_000;
const DEFAULT_KEEPALIVE_MS = 30_000;
const DEFAULT_LOAD_POLL_MS = 1000;

type Call = ServerWritableStream<Buffer, Buffer>;

/** What a gRPC server tells its listeners (`server.on(...)`). */
export interface KvGrpcServerEvents {
  /** A subscriber was cut off (it fell too far behind): it resubscribes from its last seq. */
  drop: [{ reason: 'lag'; details: string }];
}

/**
 * The engine node's gRPC endpoint (docs/protocol.md#grpc-subscribekvevents): `SubscribeKvEvents`
 * under every engine service name. One consumer of the stream's `smg_proto` batches feeds all subscribers; each batch is encoded to
 * protobuf once in Rust and the same bytes go to every stream. A subscription from a seq replays
 * the log, then continues live; from 0 it first sends the index's state as snapshot chunks; an
 * expired or foreign cursor is OUT_OF_RANGE; a subscriber
 * that falls too far behind is cut off without slowing the others.
 */
export class KvGrpcServer extends EventEmitter<KvGrpcServerEvents> {
  readonly #server: Server;
  readonly #stream: KvEventStream | null;
  readonly #token: string | undefined;
  readonly #maxLag: number;
  readonly #snapshotBlocks: number;
  readonly #maxSnapshots: number;
  readonly #maxSubscribers: number;
  #snapshots = 0;
  readonly #snapshotQueue: Array<() => void> = [];
  readonly #subscribers = new Set<Subscriber>();
  /** Stops taking the stream's batches: set while there are subscribers, to take them live. */
  #unlisten: (() => void) | null = null;
  readonly #upstream: GrpcUpstream | null;
  readonly #loads: EngineLoadPoller | null;
  readonly #health: () => { healthy: boolean; message: string };
  readonly #unknownBefore: (() => ReadonlyMap<number, bigint>) | undefined;
  #port = 0;
  #closed = false;
  readonly #stats: GrpcStats = {
    subscribers: 0,
    subscribes: {
      snapshot: 0,
      snapshotBusy: 0,
      replay: 0,
      expired: 0,
      unimplemented: 0,
      unauthenticated: 0,
      invalid: 0,
      failClosed: 0,
      full: 0,
    },
    snapshotsPending: 0,
    cutOff: 0,
    batchesSent: 0,
    maxLag: 0,
    queuedBytes: 0,
    loadOnlySent: 0,
    loads: null,
  };
  #sentByEnded = 0;
  #loadOnlyByEnded = 0;

  private constructor(server: Server, opts: KvGrpcServerOptions) {
    super();
    this.#server = server;
    this.#stream = opts.stream;
    this.#token = opts.authToken;
    this.#maxLag = checkCount('maxLagBatches', opts.maxLagBatches ?? DEFAULT_MAX_LAG, INT32_MAX);
    this.#snapshotBlocks = checkCount(
      'snapshotChunkBlocks',
      opts.snapshotChunkBlocks ?? DEFAULT_SNAPSHOT_CHUNK_BLOCKS,
      INT32_MAX,
    );
    this.#maxSnapshots = checkCount('maxSnapshots', opts.maxSnapshots ?? DEFAULT_MAX_SNAPSHOTS, INT32_MAX);
    this.#maxSubscribers = checkCount('maxSubscribers', opts.maxSubscribers ?? DEFAULT_MAX_SUBSCRIBERS, INT32_MAX);
    if (opts.authToken !== undefined && (typeof opts.authToken !== 'string' || opts.authToken === '')) {
      throw new KvPlaneError('ERR_INVALID_ARG', 'authToken must be a non-empty string');
    }
    this.#upstream = opts.upstream ? new GrpcUpstream(opts.upstream) : null;
    const loadPollMs = opts.loadPollMs ?? DEFAULT_LOAD_POLL_MS;
    if (!Number.isInteger(loadPollMs) || loadPollMs < 0) {
      throw new KvPlaneError('ERR_INVALID_ARG', `loadPollMs must be a non-negative integer, got ${loadPollMs}`);
    }
    this.#loads =
      this.#upstream && loadPollMs > 0
        ? new EngineLoadPoller(this.#upstream, opts.services ?? KV_EVENT_SERVICES, loadPollMs, () => {
            for (const s of this.#subscribers) s.heartbeat();
          })
        : null;
    const extra = opts.health;
    this.#health = () => {
      const own = this.#ownHealth();
      return own.healthy && extra ? extra() : own;
    };
    this.#unknownBefore = opts.unknownBefore;
  }

  static async create(opts: KvGrpcServerOptions & AbortOptions): Promise<KvGrpcServer> {
    return openAbortable(opts.signal, () => KvGrpcServer.#create(opts));
  }

  static async #create(opts: KvGrpcServerOptions): Promise<KvGrpcServer> {
    const grpc = grpcJs();
    const server = new grpc.Server({
      'grpc.max_send_message_length': -1,
      // Requests forwarded to an engine as large as a frame anywhere else (an inline image is
      // megabytes; vLLM's own server takes any size); kvplane's own requests are a few bytes.
      ...(opts.upstream ? { 'grpc.max_receive_message_length': MAX_FRAME_BYTES } : {}),
      'grpc.max_connection_idle_ms': idleConnectionMs(opts.idleConnectionMs, DEFAULT_IDLE_CONNECTION_MS),
      ...keepaliveOptions(opts.keepaliveMs ?? DEFAULT_KEEPALIVE_MS),
    });
    const self = new KvGrpcServer(server, opts);
    for (const service of opts.services ?? KV_EVENT_SERVICES) {
      const def: Record<string, MethodDefinition<Buffer, Buffer>> = {};
      const impl: Record<string, AnyHandler> = {};
      for (const m of ENGINE_METHODS[service] ?? [SUBSCRIBE_METHOD]) {
        const path = `/${service}/${m.name}`;
        let handler: AnyHandler;
        if (m.name === 'SubscribeKvEvents') handler = (call: Call) => self.#subscribe(call);
        else if (m.name === 'HealthCheck') handler = self.#healthHandler(service, path, m);
        else if (self.#upstream) handler = self.#guarded(m, self.#upstream.handler(path, m));
        else continue;
        def[m.name] = rawMethod(path, m.requestStream, m.responseStream);
        impl[m.name] = handler;
      }
      server.addService(def as ServiceDefinition, impl);
    }
    // gRPC's standard health check, answered as the engine services' HealthCheck is (clients
    // such as `smg serve` ask it, and take UNIMPLEMENTED for a server that is up).
    const check = { name: 'Check', requestStream: false, responseStream: false };
    server.addService({ Check: rawMethod(STANDARD_HEALTH_CHECK, false, false) } as ServiceDefinition, {
      Check: self.#healthHandler(STANDARD_HEALTH, STANDARD_HEALTH_CHECK, check),
    });
    const creds = opts.tls
      ? grpc.ServerCredentials.createSsl(
          opts.tls.ca ? Buffer.from(opts.tls.ca) : null,
          [{ cert_chain: Buffer.from(opts.tls.cert), private_key: Buffer.from(opts.tls.key) }],
          opts.tls.ca !== undefined,
        )
      : grpc.ServerCredentials.createInsecure();
    const host = opts.host ?? '0.0.0.0';
    const address = host.includes(':') ? `[${host}]:${opts.port ?? 0}` : `${host}:${opts.port ?? 0}`;
    try {
      self.#port = await bindOrThrow(
        'gRPC',
        address,
        () =>
          new Promise<number>((resolve, reject) =>
            server.bindAsync(address, creds, (err, port) => (err ? reject(err) : resolve(port))),
          ),
      );
    } catch (err) {
      self.#stopListening();
      server.forceShutdown();
      throw err;
    }
    self.#loads?.start();
    return self;
  }

  /** The bound port. */
  get port(): number {
    return this.#port;
  }

  stats(): GrpcStats {
    let sent = this.#sentByEnded;
    let loadOnlySent = this.#loadOnlyByEnded;
    let maxLag = 0;
    let queuedBytes = 0;
    for (const s of this.#subscribers) {
      sent += s.sent;
      loadOnlySent += s.loadOnlySent;
      maxLag = Math.max(maxLag, s.lag);
      queuedBytes += s.queuedBytes;
    }
    return {
      ...this.#stats,
      subscribes: { ...this.#stats.subscribes },
      subscribers: this.#subscribers.size,
      snapshotsPending: this.#snapshots + this.#snapshotQueue.length,
      batchesSent: sent,
      maxLag,
      queuedBytes,
      loadOnlySent,
      loads: this.#loads ? { ...this.#loads.stats } : null,
    };
  }

  /**
   * Ends every stream (status UNAVAILABLE, so routers resubscribe elsewhere or later) and stops,
   * giving calls in flight up to 2 s (forwarded ones still going then end UNAVAILABLE). An aborted `signal` shuts down at once and rejects with its
   * reason.
   */
  async close(options: AbortOptions = {}): Promise<void> {
    const { signal } = options;
    const force = () => this.#server.forceShutdown();
    const closing = runThenAbortable(signal, () => this.#close());
    if (signal?.aborted) force();
    else signal?.addEventListener('abort', force, { once: true });
    try {
      await closing;
    } finally {
      signal?.removeEventListener('abort', force);
    }
  }

  async #close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#stopListening();
    this.#loads?.stop();
    this.#upstream?.close();
    for (const s of [...this.#subscribers])
      s.cut({ code: status.UNAVAILABLE, details: 'the KV event server is shutting down' });
    await new Promise<void>((resolve) => {
      let forced: NodeJS.Timeout | undefined;
      const timer = setTimeout(() => {
        // Forwarded calls still in flight end UNAVAILABLE (a gateway retries that elsewhere),
        // not with the CANCELLED of a forced shutdown; their statuses get a moment to go out.
        this.#upstream?.endInFlight(status.UNAVAILABLE, 'kvplane is shutting down');
        forced = setTimeout(() => {
          this.#server.forceShutdown();
          resolve();
        }, 500);
      }, 2000);
      this.#server.tryShutdown(() => {
        clearTimeout(timer);
        clearTimeout(forced);
        resolve();
      });
    });
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  #metadata(): Metadata {
    const md = new (grpcJs().Metadata)();
    if (this.#stream && !this.#stream.closed) md.set('x-kvplane-epoch', this.#stream.epoch.toString());
    return md;
  }

  /** Healthy unless the stream is closed or failed closed. */
  #ownHealth(): { healthy: boolean; message: string } {
    const stream = this.#stream;
    if (stream === null) return { healthy: true, message: 'no KV event stream on this server' };
    if (stream.closed) return { healthy: false, message: 'the KV event stream is closed' };
    const failed = stream.failClosed[0];
    if (failed) return { healthy: false, message: `KV events failed closed: ${failed.message}` };
    return { healthy: true, message: '' };
  }

  /**
   * `HealthCheck` on `service`: while kvplane is healthy, the engine's answer (with an upstream)
   * or healthy; otherwise unhealthy with the reason, whatever the engine says.
   */
  #healthHandler(service: string, path: string, m: EngineMethod): AnyHandler {
    const forward = this.#upstream?.handler(path, m);
    const check = (call: ServerUnaryCall<Buffer, Buffer>, callback: sendUnaryData<Buffer>) => {
      const own = this.#health();
      if (own.healthy && forward) {
        forward(call, callback);
        return;
      }
      try {
        callback(null, encodeHealthResponse(service, own.healthy, own.message));
      } catch (err) {
        callback({ code: status.INTERNAL, details: (err as Error).message } as ServiceError);
      }
    };
    // gRPC's standard check is asked by what cannot hold a token (Kubernetes' gRPC probes,
    // `smg serve`'s worker check): it says only serving or not, and needs none.
    return service === STANDARD_HEALTH ? check : this.#guarded(m, check);
  }

  /** `handler` behind the bearer token check, when the server has one. */
  #guarded(m: EngineMethod, handler: AnyHandler): AnyHandler {
    const token = this.#token;
    if (token === undefined) return handler;
    return (call: { metadata: Metadata; emit(ev: 'error', e: unknown): void }, callback?: sendUnaryData<Buffer>) => {
      if (bearerMatches(call.metadata.get('authorization')[0]?.toString(), token)) {
        handler(call, callback);
        return;
      }
      const err = Object.assign(new Error('missing or wrong bearer token'), {
        code: status.UNAUTHENTICATED,
        details: 'missing or wrong bearer token',
      });
      if (!m.responseStream && callback) callback(err as ServiceError);
      else call.emit('error', err);
    };
  }

  #refuse(call: Call, code: number, details: string): void {
    call.emit('error', Object.assign(new Error(details), { code, details, metadata: this.#metadata() }));
  }

  #subscribe(call: Call): void {
    const counts = this.#stats.subscribes;
    if (this.#token !== undefined && !bearerMatches(call.metadata.get('authorization')[0]?.toString(), this.#token)) {
      counts.unauthenticated++;
      this.#refuse(call, status.UNAUTHENTICATED, 'missing or wrong bearer token');
      return;
    }
    const stream = this.#stream;
    if (!stream || stream.closed || this.#closed) {
      counts.unimplemented++;
      this.#refuse(call, status.UNIMPLEMENTED, 'KV events are not enabled on this server');
      return;
    }
    let start: bigint;
    let loadsEarly: boolean;
    try {
      ({ start, loadRecordsEarly: loadsEarly } = decodeSubscribeRequest(call.request));
    } catch (err) {
      counts.invalid++;
      this.#refuse(call, status.INVALID_ARGUMENT, `bad SubscribeKvEventsRequest: ${(err as Error).message}`);
      return;
    }
    const failed = stream.failClosed[0];
    if (failed) {
      counts.failClosed++;
      this.#refuse(call, status.FAILED_PRECONDITION, failed.message);
      return;
    }
    if (this.#subscribers.size >= this.#maxSubscribers) {
      counts.full++;
      this.#refuse(call, status.RESOURCE_EXHAUSTED, `${this.#maxSubscribers} subscribers already; retry later`);
      return;
    }
    // From 0 ("the current state"): the index's state as snapshot chunks, then live.
    const cursor = start === 0n ? null : stream.indexer.cursor(start);
    if (cursor?.kind === 'expired') {
      // OUT_OF_RANGE: a router resyncs by resubscribing from 0, which sends it a snapshot.
      counts.expired++;
      this.#refuse(call, status.OUT_OF_RANGE, cursor.message);
      return;
    }
    call.sendMetadata(this.#metadata());
    const onEnd = (s: Subscriber) => {
      this.#subscribers.delete(s);
      if (this.#subscribers.size === 0) this.#stopListening();
      this.#sentByEnded += s.sent;
      this.#loadOnlyByEnded += s.loadOnlySent;
    };
    const sub = new Subscriber(
      call,
      cursor === null ? null : cursor.start,
      this.#maxLag,
      onEnd,
      this.#loads,
      loadsEarly,
    );
    this.#subscribers.add(sub);
    // Live batches from now on: taken before the catch-up reads the log, so none falls between.
    this.#unlisten ??= stream.consume('smg_proto', (b) => this.#fanOut(b));
    let snapshot: Promise<Snapshot | null> | undefined;
    let release = () => {};
    if (cursor === null) {
      counts.snapshot++;
      // At most `maxSnapshots` at once, each holding a copy of the index: the rest wait their turn
      // (their streams are open; live batches meanwhile are in the log).
      snapshot = this.#snapshotSlot().then((done) => {
        release = done;
        return sub.done ? null : stream.indexer.snapshot(this.#snapshotBlocks, this.#unknownBefore?.());
      });
    } else counts.replay++;
    sub
      .catchUp((from, max) => stream.indexer.replay(from, max, 'smg_proto'), snapshot)
      .finally(() => release())
      .then(
        (caughtUp) => {
          if (!caughtUp)
            this.#cutOff(sub, 'subscriber fell behind the replay log; resubscribe from the last applied seq');
          else if (sub.lag > this.#maxLag) this.#cutOff(sub);
        },
        (err: unknown) =>
          sub.cut({
            code: status.INTERNAL,
            details: `replay failed: ${(err as Error).message}`,
            metadata: this.#metadata(),
          }),
      );
  }

  /**
   * Resolves with a release function once a snapshot may start. (A subscriber gone meanwhile
   * takes no snapshot and releases its turn at once.)
   */
  #snapshotSlot(): Promise<() => void> {
    let released = false;
    const release = () => {
      if (released) return;
      released = true;
      this.#snapshots--;
      const next = this.#snapshotQueue.shift();
      next?.();
    };
    if (this.#snapshots < this.#maxSnapshots) {
      this.#snapshots++;
      return Promise.resolve(release);
    }
    this.#stats.subscribes.snapshotBusy++;
    return new Promise((resolve) => {
      this.#snapshotQueue.push(() => {
        this.#snapshots++;
        resolve(release);
      });
    });
  }

  #cutOff(
    sub: Subscriber,
    details = `subscriber fell more than ${this.#maxLag} batches behind; resubscribe from the last applied seq`,
  ): void {
    this.#stats.cutOff++;
    this.emit('drop', { reason: 'lag', details });
    sub.cut({
      code: status.RESOURCE_EXHAUSTED,
      details,
      metadata: this.#metadata(),
    });
  }

  /**
   * Stops taking the stream's batches. The server takes them (and so the stream encodes them in
   * gRPC's format, on the link thread for a relayed engine) only while it has subscribers: the
   * first one starts it before its catch-up reads the log, and batches published with none
   * here are read from the log by the next one's catch-up.
   */
  #stopListening(): void {
    this.#unlisten?.();
    this.#unlisten = null;
  }

  #fanOut(b: EncodedBatches): void {
    const n = b.payloads.length;
    for (const sub of this.#subscribers) {
      for (let i = 0; i < n; i++) {
        if (!sub.live(b.seqs[i] as bigint, b.payloads[i] as Buffer)) {
          this.#cutOff(sub);
          break;
        }
      }
    }
    const failed = this.#stream?.failClosed[0];
    if (failed) {
      const end: EndStatus = { code: status.FAILED_PRECONDITION, details: failed.message, metadata: this.#metadata() };
      for (const sub of this.#subscribers) sub.endAfterQueued(end);
    }
  }
}
