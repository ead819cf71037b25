import { Metadata, Server, ServerCredentials, type ServerWritableStream, status } from '@grpc/grpc-js';
import { KvPlaneError } from '../../errors.js';
import type { EncodedBatches } from '../../stream/batches.js';
import type { KvEventStream } from '../../stream/stream.js';
import { bearerMatches } from '../auth.js';
import { decodeSubscribeRequest, KV_EVENT_SERVICES, subscribeDefinition } from './services.js';
import { type EndStatus, Subscriber } from './subscriber.js';

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
   * Batches a subscriber may fall behind before it is cut off with RESOURCE_EXHAUSTED (it
   * resumes by resubscribing from its last seq). Default 1024.
   */
  maxLagBatches?: number;
  /** Services to register `SubscribeKvEvents` under. Default: all of `KV_EVENT_SERVICES`. */
  services?: readonly string[];
}

export interface GrpcStats {
  /** Open `SubscribeKvEvents` streams. */
  subscribers: number;
  /** Subscriptions by how they began or were refused. */
  subscribes: {
    live: number;
    replay: number;
    expired: number;
    unimplemented: number;
    unauthenticated: number;
    invalid: number;
    failClosed: number;
  };
  /** Subscribers cut off for falling behind (RESOURCE_EXHAUSTED). */
  cutOff: number;
  /** Batches handed to subscriber streams (live and replayed). */
  batchesSent: number;
  /** The most batches any subscriber has waiting (its lag). */
  maxLag: number;
  /** Bytes queued in kvplane for all subscribers (each bounded by its lag cut-off). */
  queuedBytes: number;
}

const DEFAULT_MAX_LAG = 1024;

type Call = ServerWritableStream<Buffer, Buffer>;

/**
 * The engine node's gRPC endpoint (docs/protocol.md#grpc-subscribekvevents): `SubscribeKvEvents`
 * under every engine service name. One consumer of the stream's `smg_proto` batches feeds all subscribers; each batch is encoded to
 * protobuf once in Rust and the same bytes go to every stream. A subscription from a seq replays
 * the log, then continues live; an expired or foreign cursor is FAILED_PRECONDITION; a subscriber
 * that falls too far behind is cut off without slowing the others.
 */
export class KvGrpcServer {
  readonly #server: Server;
  readonly #stream: KvEventStream | null;
  readonly #token: string | undefined;
  readonly #maxLag: number;
  readonly #subscribers = new Set<Subscriber>();
  readonly #unlisten: () => void;
  #port = 0;
  #closed = false;
  readonly #stats: GrpcStats = {
    subscribers: 0,
    subscribes: { live: 0, replay: 0, expired: 0, unimplemented: 0, unauthenticated: 0, invalid: 0, failClosed: 0 },
    cutOff: 0,
    batchesSent: 0,
    maxLag: 0,
    queuedBytes: 0,
  };
  #sentByEnded = 0;

  private constructor(server: Server, opts: KvGrpcServerOptions) {
    this.#server = server;
    this.#stream = opts.stream;
    this.#token = opts.authToken;
    this.#maxLag = opts.maxLagBatches ?? DEFAULT_MAX_LAG;
    if (!Number.isInteger(this.#maxLag) || this.#maxLag < 1) {
      throw new KvPlaneError('ERR_INVALID_ARG', `maxLagBatches must be a positive integer, got ${this.#maxLag}`);
    }
    if (opts.authToken !== undefined && (typeof opts.authToken !== 'string' || opts.authToken === '')) {
      throw new KvPlaneError('ERR_INVALID_ARG', 'authToken must be a non-empty string');
    }
    if (this.#stream) {
      this.#unlisten = this.#stream.consume('smg_proto', (b) => this.#fanOut(b));
    } else {
      this.#unlisten = () => {};
    }
  }

  static async create(opts: KvGrpcServerOptions): Promise<KvGrpcServer> {
    const server = new Server({ 'grpc.max_send_message_length': -1 });
    const self = new KvGrpcServer(server, opts);
    const handler = { SubscribeKvEvents: (call: Call) => self.#subscribe(call) };
    for (const service of opts.services ?? KV_EVENT_SERVICES) server.addService(subscribeDefinition(service), handler);
    const creds = opts.tls
      ? ServerCredentials.createSsl(
          opts.tls.ca ? Buffer.from(opts.tls.ca) : null,
          [{ cert_chain: Buffer.from(opts.tls.cert), private_key: Buffer.from(opts.tls.key) }],
          opts.tls.ca !== undefined,
        )
      : ServerCredentials.createInsecure();
    const host = opts.host ?? '0.0.0.0';
    const address = host.includes(':') ? `[${host}]:${opts.port ?? 0}` : `${host}:${opts.port ?? 0}`;
    try {
      self.#port = await new Promise<number>((resolve, reject) =>
        server.bindAsync(address, creds, (err, port) => (err ? reject(err) : resolve(port))),
      );
    } catch (err) {
      self.#unlisten();
      server.forceShutdown();
      throw new KvPlaneError('ERR_INVALID_ARG', `cannot bind gRPC on ${address}: ${(err as Error).message}`, {
        cause: err,
      });
    }
    return self;
  }

  /** The bound port. */
  get port(): number {
    return this.#port;
  }

  stats(): GrpcStats {
    let sent = this.#sentByEnded;
    let maxLag = 0;
    let queuedBytes = 0;
    for (const s of this.#subscribers) {
      sent += s.sent;
      maxLag = Math.max(maxLag, s.lag);
      queuedBytes += s.queuedBytes;
    }
    return {
      ...this.#stats,
      subscribes: { ...this.#stats.subscribes },
      subscribers: this.#subscribers.size,
      batchesSent: sent,
      maxLag,
      queuedBytes,
    };
  }

  /** Ends every stream (status UNAVAILABLE, so routers resubscribe elsewhere or later) and stops. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#unlisten();
    for (const s of [...this.#subscribers])
      s.cut({ code: status.UNAVAILABLE, details: 'the KV event server is shutting down' });
    await new Promise<void>((resolve) => {
      const timer = setTimeout(() => {
        this.#server.forceShutdown();
        resolve();
      }, 2000);
      this.#server.tryShutdown(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  #metadata(): Metadata {
    const md = new Metadata();
    if (this.#stream && !this.#stream.closed) md.set('x-kvplane-epoch', this.#stream.epoch.toString());
    return md;
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
    try {
      start = decodeSubscribeRequest(call.request);
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
    const cursor = stream.indexer.cursor(start);
    if (cursor.kind === 'expired') {
      counts.expired++;
      this.#refuse(call, status.FAILED_PRECONDITION, cursor.message);
      return;
    }
    call.sendMetadata(this.#metadata());
    const sub = new Subscriber(call, cursor.kind === 'live' ? null : cursor.start, this.#maxLag, (s) => {
      this.#subscribers.delete(s);
      this.#sentByEnded += s.sent;
    });
    this.#subscribers.add(sub);
    if (cursor.kind === 'live') {
      counts.live++;
      return;
    }
    counts.replay++;
    sub
      .catchUp((from, max) => stream.indexer.replay(from, max, 'smg_proto'))
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

  #cutOff(
    sub: Subscriber,
    details = `subscriber fell more than ${this.#maxLag} batches behind; resubscribe from the last applied seq`,
  ): void {
    this.#stats.cutOff++;
    sub.cut({
      code: status.RESOURCE_EXHAUSTED,
      details,
      metadata: this.#metadata(),
    });
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
