import { EventEmitter } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { type AbortOptions, openAbortable, runThenAbortable } from '../../abort.js';
import type { RecoverChunks } from '../../indexer.js';
import { jsonExact } from '../../json.js';
import type { KvEventPublisher } from '../../publisher.js';
import type { SourceHealth } from '../../sources/source.js';
import { bearerMatches } from '../auth.js';
import type { KvGrpcServer } from '../grpc/server.js';
import { trimMemorySoon } from '../memory.js';
import { listen, requestUrl, serveJson } from './listen.js';
import { type MetricsOptions, publisherMetrics, type RecoverCounts } from './metrics.js';

/** An input feeding the publisher, as `/healthz` lists it. */
export interface SourceInfo {
  name: string;
  /** `sim`, `zmq`, `api`, ... */
  kind: string;
  /** The source's own health; without it the source counts as `ok`. */
  health?: () => SourceHealth;
  /** The source's counters (an engine source's per-rank state), shown in `/healthz`. */
  stats?: () => Record<string, unknown>;
}

export interface KvHttpServerOptions {
  publisher: KvEventPublisher;
  /** Default `127.0.0.1`. */
  host?: string;
  /** Default 0 (the OS picks; read `port`). */
  port?: number;
  sources?: readonly SourceInfo[];
  /** When set, every request must carry `Authorization: Bearer <token>` (else 401). */
  authToken?: string;
  /** The node's gRPC server, for its figures in `/metrics` and `/healthz`. */
  grpc?: KvGrpcServer | null;
  /**
   * `/kv_recover` answers computed at once (each takes a worker thread of the pool the drains
   * also use); more are refused with 429 and `Retry-After`. Default 2.
   */
  maxConcurrentRecovers?: number;
  /**
   * How long a `/kv_recover` answer waits for its client to take the next chunk before the
   * connection is closed and counted `Abandoned`; the answer holds one of `maxConcurrentRecovers`
   * until then. Default 30,000 ms.
   */
  recoverSendTimeoutMs?: number;
  /**
   * A connection that sends and receives nothing this long is closed, one that never sent a
   * request included (peers that connect and say nothing would otherwise hold the process's file
   * descriptors until it ran out). Default 60,000 ms.
   */
  idleConnectionMs?: number;
  /** The application's prom-client registry and a metric name prefix (`/metrics`). */
  metrics?: MetricsOptions;
}

/** What an HTTP server tells its listeners (`server.on(...)`). */
export interface KvHttpServerEvents {
  /**
   * A `/kv_recover` request not served: `refused` (429, too many at once; the client retries) or
   * `abandoned` (its client stopped reading within the send timeout).
   */
  drop: [{ reason: 'recover_refused' | 'recover_abandoned' }];
}

/**
 * The engine node's HTTP endpoints (docs/protocol.md#http-kv_recover): `GET /kv_recover?start=S&end=E` (JSON, or msgpack
 * with `Accept: application/msgpack` or `?format=msgpack`), `GET /healthz`, `GET /metrics`.
 */
export class KvHttpServer extends EventEmitter<KvHttpServerEvents> {
  readonly #server: Server;
  readonly #publisher: KvEventPublisher;
  readonly #sources: readonly SourceInfo[];
  readonly #token: string | undefined;
  readonly #grpc: KvGrpcServer | null;
  readonly #recover: RecoverCounts = { Events: 0, TreeDump: 0, TooNew: 0, InvalidRange: 0, Refused: 0, Abandoned: 0 };
  readonly #maxRecovering: number;
  readonly #recoverSendTimeoutMs: number;
  #recovering = 0;
  readonly #metrics;

  private constructor(server: Server, opts: KvHttpServerOptions) {
    super();
    this.#server = server;
    this.#publisher = opts.publisher;
    this.#sources = opts.sources ?? [];
    this.#token = opts.authToken;
    this.#grpc = opts.grpc ?? null;
    this.#maxRecovering = opts.maxConcurrentRecovers ?? 2;
    this.#recoverSendTimeoutMs = opts.recoverSendTimeoutMs ?? 30_000;
    const grpc = this.#grpc;
    this.#metrics = publisherMetrics(
      opts.publisher,
      this.#recover,
      grpc ? () => grpc.stats() : undefined,
      this.#sources,
      opts.metrics,
    );
  }

  static async create(opts: KvHttpServerOptions & AbortOptions): Promise<KvHttpServer> {
    return openAbortable(opts.signal, () => KvHttpServer.#create(opts));
  }

  static async #create(opts: KvHttpServerOptions): Promise<KvHttpServer> {
    const server = createServer();
    const self = new KvHttpServer(server, opts);
    serveJson(server, (req, res) => self.#handle(req, res), opts.idleConnectionMs);
    await listen(server, opts.port ?? 0, opts.host ?? '127.0.0.1');
    return self;
  }

  get port(): number {
    return (this.#server.address() as AddressInfo).port;
  }

  get url(): string {
    const a = this.#server.address() as AddressInfo;
    const host = a.family === 'IPv6' ? `[${a.address}]` : a.address;
    return `http://${host}:${a.port}`;
  }

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = requestUrl(req, 'http://localhost');
    try {
      if (url === null) return this.#send(res, 400, 'application/json', '{"error":"malformed request target"}');
      if (this.#token !== undefined && !bearerMatches(req.headers.authorization, this.#token)) {
        res.setHeader('www-authenticate', 'Bearer');
        return this.#send(res, 401, 'application/json', '{"error":"missing or wrong bearer token"}');
      }
      if (req.method !== 'GET' && req.method !== 'HEAD') {
        return this.#send(res, 405, 'application/json', '{"error":"method not allowed"}');
      }
      switch (url.pathname) {
        case '/kv_recover':
          return await this.#kvRecover(req, res, url);
        case '/healthz':
          return this.#send(res, 200, 'application/json', this.#health());
        case '/metrics':
          return this.#send(res, 200, this.#metrics.contentType, await this.#metrics.metrics());
        default:
          return this.#send(res, 404, 'application/json', '{"error":"not found"}');
      }
    } catch (err) {
      const closed = this.#publisher.closed;
      this.#send(res, closed ? 503 : 500, 'application/json', JSON.stringify({ error: (err as Error).message }));
    }
  }

  async #kvRecover(req: IncomingMessage, res: ServerResponse, url: URL): Promise<void> {
    if (this.#recovering >= this.#maxRecovering) {
      this.#recover.Refused++;
      this.emit('drop', { reason: 'recover_refused' });
      res.setHeader('retry-after', '1');
      return this.#send(res, 429, 'application/json', '{"error":"too many /kv_recover requests at once; retry"}');
    }
    const format = url.searchParams.get('format');
    if (format !== null && format !== 'json' && format !== 'msgpack') {
      return this.#send(res, 400, 'application/json', '{"error":"format is json or msgpack"}');
    }
    const msgpack = format === 'msgpack' || (format === null && /application\/msgpack/.test(req.headers.accept ?? ''));
    const param = (name: string) => url.searchParams.get(name) ?? undefined;
    this.#recovering++;
    let answer: RecoverChunks | undefined;
    try {
      answer = await this.#publisher.indexer.recoverQueryChunks(
        param('start'),
        param('end'),
        msgpack ? 'msgpack' : 'json',
      );
      this.#recover[answer.kind]++;
      const status = answer.kind === 'InvalidRange' ? 400 : 200;
      const sent = await this.#sendChunks(res, status, msgpack ? 'application/msgpack' : 'application/json', answer);
      if (!sent) {
        this.#recover.Abandoned++;
        this.emit('drop', { reason: 'recover_abandoned' });
      }
    } finally {
      answer?.release();
      this.#recovering--;
      if (this.#recovering === 0) trimMemorySoon();
    }
  }

  /**
   * Sends an answer chunk by chunk, encoding the next only once the socket has taken the last
   * (a one-chunk answer goes out with its length; the next chunk is encoded while one drains). False when the client stopped reading for
   * `recoverSendTimeoutMs` or went away: the connection is then closed.
   */
  async #sendChunks(res: ServerResponse, status: number, type: string, answer: RecoverChunks): Promise<boolean> {
    const first = await answer.chunks.next();
    const second = first.done ? first : await answer.chunks.next();
    if (second.done) {
      this.#send(res, status, type, first.done ? Buffer.alloc(0) : first.value);
      return true;
    }
    res.writeHead(status, { 'content-type': type });
    if (res.req.method === 'HEAD') {
      res.end();
      return true;
    }
    if (!(await this.#write(res, first.value))) return false;
    // Each chunk is encoded while the one before it drains: at most two are held at a time.
    let current: Buffer = second.value;
    for (;;) {
      const next = answer.chunks.next();
      if (!(await this.#write(res, current))) {
        await next;
        return false;
      }
      const r = await next;
      if (r.done) break;
      current = r.value;
    }
    res.end();
    return true;
  }

  /** Writes a chunk and waits until the socket can take more (false: timed out or closed). */
  #write(res: ServerResponse, chunk: Buffer): Promise<boolean> {
    if (res.destroyed) return Promise.resolve(false);
    if (res.write(chunk)) return Promise.resolve(true);
    return new Promise((resolve) => {
      const done = (ok: boolean) => {
        clearTimeout(timer);
        res.off('drain', drained);
        res.off('close', closed);
        if (!ok) res.destroy();
        resolve(ok);
      };
      const drained = () => done(true);
      const closed = () => done(false);
      const timer = setTimeout(closed, this.#recoverSendTimeoutMs);
      res.once('drain', drained);
      res.once('close', closed);
    });
  }

  #health(): string {
    const s = this.#publisher.stats();
    const ix = this.#publisher.closed ? undefined : this.#publisher.indexer.stats();
    return jsonExact({
      status: s.failClosed.length > 0 ? 'fail_closed' : 'ok',
      epoch: this.#publisher.epoch,
      last_seq: s.lastSeq,
      oldest_seq: ix?.oldestSeq ?? null,
      // Where a router subscribes (a `*` or 0.0.0.0 host is this node's own address).
      endpoints: {
        zmq: this.#publisher.closed ? null : this.#publisher.endpoint,
        replay: this.#publisher.closed ? null : this.#publisher.replayEndpoint,
        grpc_port: this.#grpc?.port ?? null,
      },
      sources: this.#sources.map((src) => {
        const own = src.health?.() ?? { state: 'ok' };
        const state = s.failClosed.length > 0 ? 'fail_closed' : own.state;
        return {
          name: src.name,
          kind: src.kind,
          state,
          ...(own.reason && state !== 'fail_closed' ? { reason: own.reason } : {}),
          ...(src.stats ? { stats: src.stats() } : {}),
        };
      }),
      fail_closed: s.failClosed.map((f) => ({ dp_rank: f.dpRank, reason: f.message })),
      subscribers: s.subscribers,
      grpc_subscribers: this.#grpc?.stats().subscribers ?? null,
      queued: s.queued,
      drops: s.drops,
    });
  }

  #send(res: ServerResponse, status: number, type: string, body: string | Buffer): void {
    res.writeHead(status, { 'content-type': type, 'content-length': Buffer.byteLength(body) });
    res.end(res.req.method === 'HEAD' ? undefined : body);
  }

  /** Drops every connection and stops listening (`signal`: stop waiting; the close goes on). */
  async close(options: AbortOptions = {}): Promise<void> {
    this.#server.closeAllConnections();
    await runThenAbortable(options.signal, () => new Promise<void>((resolve) => this.#server.close(() => resolve())));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
