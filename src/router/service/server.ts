import { EventEmitter } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import type * as Native from '../../../index.js';
import { type AbortOptions, openAbortable, runThenAbortable } from '../../abort.js';
import { KvPlaneError } from '../../errors.js';
import { bearerMatches } from '../../transports/auth.js';
import { listen, requestUrl, serveJson } from '../../transports/http/listen.js';
import type { MetricsOptions } from '../../transports/http/metrics.js';
import type { RecoveryKind } from '../subscriptions/subscription.js';
import { AccessLog } from './access_log.js';
import { queryAnswer } from './answers.js';
import { Fields, HttpError, jsonExact, parseHashQuery, parseJsonExact, parseTokenQuery } from './json.js';
import { indexerMetrics } from './metrics.js';
import { type PeerRecovery, Peers, recoverFromPeers } from './peers.js';
import { checkEndpoint, type Registration, Registry } from './registry.js';
import { discoverNode, nodeUrl, sourceOf } from './sources.js';
import { loadState, saveState } from './state.js';

export interface IndexerServerOptions {
  /** Default `0.0.0.0`, as Dynamo's indexer. */
  host?: string;
  /** Default 8090, as Dynamo's indexer; 0 lets the OS pick (read `port`). */
  port?: number;
  /** Registrations are kept here and followed again after a restart. */
  stateFile?: string;
  /**
   * The bearer token of the kvplane nodes it follows (their `--auth-token-file`), sent to each
   * node's `/healthz` when registered by URL, to its `/kv_recover` and to its gRPC stream. With
   * it set, `/register` and `/unregister` need it too (401 otherwise): a registration names
   * where the token is sent.
   */
  nodeToken?: string;
  /** Registered at start (`--workers`). */
  workers?: readonly Omit<Registration, 'url' | 'replayEndpoint'>[];
  onWarning?: (msg: string, detail: Record<string, unknown>) => void;
  /** How ZMQ publishers are read (`RouterIndexOptions.zmqReceive`). Default `native`. */
  zmqReceive?: 'native' | 'js';
  /**
   * A connection that sends and receives nothing this long is closed, one that never sent a
   * request included. Default 60,000 ms.
   */
  idleConnectionMs?: number;
  /** The application's prom-client registry and a metric name prefix (`/metrics`). */
  metrics?: MetricsOptions;
  /**
   * Peer indexers following the same workers (`--peers`): before it serves, the indexer loads
   * the `/dump` of the first that answers (Dynamo's P2P recovery). With a state file, the peers
   * saved there come first.
   */
  peers?: readonly string[];
  /**
   * How long after following its workers the indexer waits before it asks a peer (default
   * 1,000 ms, as Dynamo's): long enough for the dump to cover what the new subscriptions missed
   * while they joined.
   */
  peerDelayMs?: number;
  /** A JSON line per answered request is appended here (`/reopen_logs` opens it again). */
  accessLog?: string;
  /** The access log's times in the local time zone (default UTC). */
  accessLogLocalTime?: boolean;
  /** The request header whose value the access log writes as `trace_id` (default `x-trace-id`). */
  traceIdHeader?: string;
  /**
   * `/dump` writes each block's `tokens_hash`, which a Dynamo indexer needs to start from it:
   * the indexes keep each block's own content hash (8 bytes a block). Default false: `/dump`
   * writes each block's `kvplane_key`, which a kvplane indexer starts from.
   */
  dumpTokensHash?: boolean;
}

/** Body limits: `/query` and `/query_by_hash` take 8 MiB (long prompts), the rest 2 MB. */
const QUERY_BODY_BYTES = 8 * 1024 * 1024;
const BODY_BYTES = 2 * 1000 * 1000;

const ROUTES: Record<string, 'GET' | 'POST'> = {
  '/register': 'POST',
  '/unregister': 'POST',
  '/workers': 'GET',
  '/query': 'POST',
  '/query_by_hash': 'POST',
  '/dump': 'GET',
  '/health': 'GET',
  '/metrics': 'GET',
  '/register_peer': 'POST',
  '/deregister_peer': 'POST',
  '/peers': 'GET',
  '/reopen_logs': 'POST',
};

/** The routes that need the node token when one is set: they change what the indexer reads. */
const GUARDED = new Set(['/register', '/unregister', '/register_peer', '/deregister_peer']);

/** What an `IndexerServer` tells as it follows its workers (each from one of its indexes). */
export interface IndexerServerEvents {
  /** A worker's state was restored (`RouterIndexEvents.recovered`), with its index. */
  recovered: [{ modelName: string; routingGroup: string; workerId: bigint; dpRank: number; kind: RecoveryKind }];
  /** A subscription's warning (gaps, reconnects, rebuilds), its detail naming the index. */
  warning: [message: string, detail: Record<string, unknown>];
}

/** What a request's answer is logged with. */
interface Answered {
  model: string | null;
}

/**
 * `kvplane indexer`: Dynamo's standalone KV indexer HTTP API (Mooncake KV Indexer RFC) over
 * `RouterIndex`es (docs/architecture.md#router-side), with the same routes, field names, answer
 * shapes and statuses, every error a JSON `{"error": ...}`; plus the registration of a kvplane
 * node by its HTTP URL and a state file that outlives restarts.
 */
export class IndexerServer extends EventEmitter<IndexerServerEvents> {
  readonly registry: Registry;
  readonly #server: Server;
  readonly #metrics;
  readonly #nodeToken: string | undefined;
  readonly peers: Peers;
  readonly #accessLog: AccessLog | null;
  readonly #traceIdHeader: string;
  /** What the start loaded from a peer (`null`: no peer answered, or none was given). */
  peerRecovery: PeerRecovery | null = null;

  private constructor(server: Server, registry: Registry, peers: Peers, opts: IndexerServerOptions) {
    super();
    this.#server = server;
    this.registry = registry;
    this.peers = peers;
    this.#nodeToken = opts.nodeToken;
    const accessLog = opts.accessLog ? new AccessLog(opts.accessLog, opts.accessLogLocalTime) : null;
    this.#accessLog = accessLog;
    this.#metrics = indexerMetrics(registry, opts.metrics, accessLog ? () => accessLog.errors : undefined);
    this.#traceIdHeader = (opts.traceIdHeader ?? 'x-trace-id').toLowerCase();
  }

  static async create(opts: IndexerServerOptions & AbortOptions = {}): Promise<IndexerServer> {
    return openAbortable(opts.signal, () => IndexerServer.#create(opts));
  }

  static async #create(opts: IndexerServerOptions): Promise<IndexerServer> {
    const registry = new Registry(opts.onWarning, opts.zmqReceive, opts.dumpTokensHash ?? false);
    const server = createServer();
    const saved = opts.stateFile ? loadState(opts.stateFile) : { registrations: [], peers: [] };
    const peers = new Peers();
    for (const url of [...saved.peers, ...(opts.peers ?? [])]) {
      try {
        peers.add(url);
      } catch (err) {
        throw new KvPlaneError('ERR_INVALID_ARG', (err as Error).message);
      }
    }
    const self = new IndexerServer(server, registry, peers, opts);
    registry.onIndex = (ix, modelName, routingGroup) => {
      ix.on('recovered', (e) => self.emit('recovered', { ...e, modelName, routingGroup }));
      ix.on('warning', (msg, detail) => self.emit('warning', msg, { ...detail, modelName, routingGroup }));
    };
    try {
      // Subscriptions made before the peer's dump is loaded hold what arrives until it is.
      if (peers.list().length > 0) registry.holdForPeer();
      for (const r of saved.registrations) {
        try {
          registry.register(r, sourceOf(r, opts.nodeToken));
        } catch (err) {
          // A registration this version refuses (two pairs one name): left out, and said so.
          if (!(err instanceof HttpError && err.status === 409)) throw err;
          opts.onWarning?.('a saved registration was not restored', {
            instanceId: r.instanceId,
            dpRank: r.dpRank,
            error: err.message,
          });
        }
      }
      for (const w of opts.workers ?? []) {
        if (registry.instances().get(w.instanceId)?.ranks.has(w.dpRank)) continue;
        const r: Registration = { ...w, replayEndpoint: null, url: null };
        checkEndpoint(r.endpoint);
        registry.register(r, sourceOf(r, opts.nodeToken));
      }
      const stateFile = opts.stateFile;
      if (stateFile) {
        const save = () => saveState(stateFile, { registrations: registry.registrations(), peers: peers.list() });
        registry.onChange = save;
        peers.onChange = save;
        save();
      }
      if (peers.list().length > 0) {
        // Its workers are followed already, what arrives held: the dump then covers what their
        // subscriptions missed while joining, and what they held is applied over it.
        if (registry.registrations().length > 0) await sleep(opts.peerDelayMs ?? 1000);
        self.peerRecovery = await recoverFromPeers(peers.list(), registry, opts.onWarning);
        registry.endPeerHold(new Set(self.peerRecovery?.indexes.map((i) => i.name)));
        if (self.peerRecovery === null)
          opts.onWarning?.('no peer answered /dump: starting with an empty index', { peers: peers.list() });
      }
      serveJson(server, (req, res) => self.#handle(req, res), opts.idleConnectionMs);
      await listen(server, opts.port ?? 8090, opts.host ?? '0.0.0.0');
    } catch (err) {
      // Nothing is left following workers when the server does not start.
      await registry.close();
      await self.#accessLog?.close();
      throw err;
    }
    return self;
  }

  get port(): number {
    return (this.#server.address() as AddressInfo).port;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const t0 = performance.now();
    const url = requestUrl(req, 'http://indexer');
    const route = url?.pathname ?? '';
    const method = ROUTES[route];
    const answered: Answered = { model: null };
    try {
      if (url === null) throw new HttpError(400, 'malformed request target');
      if (method === undefined) throw new HttpError(404, `no route ${route}`);
      const m = req.method === 'HEAD' ? 'GET' : req.method;
      if (m !== method) {
        res.setHeader('allow', method === 'GET' ? 'GET,HEAD' : 'POST');
        throw new HttpError(405, `${req.method} is not allowed on ${route}`);
      }
      // The node token is sent to the nodes a registration names: with one set, only a holder
      // of it may register (else anyone reaching the indexer could name a URL and collect it),
      // or name the peers a restart loads its index from.
      const nodeToken = this.#nodeToken;
      if (nodeToken !== undefined && GUARDED.has(route) && !bearerMatches(req.headers.authorization, nodeToken)) {
        res.setHeader('www-authenticate', 'Bearer');
        throw new HttpError(401, `${route} needs the node token (Authorization: Bearer <token>)`);
      }
      if (method === 'GET') return await this.#get(route, url, res);
      const limit = route.startsWith('/query') ? QUERY_BODY_BYTES : BODY_BYTES;
      const bytes = await readJson(req, limit);
      const answer =
        route === '/query'
          ? this.#query(parseTokenQuery(bytes), answered)
          : route === '/query_by_hash'
            ? this.#queryByHash(parseHashQuery(bytes), answered)
            : await this.#post(route, fieldsOf(bytes), answered);
      // Query answers hold no bigints (instance ids are keys).
      this.#send(res, answer.status, answer.body, !route.startsWith('/query'));
    } catch (err) {
      const status = err instanceof HttpError ? err.status : 500;
      if (status === 413) res.setHeader('connection', 'close');
      this.#send(res, status, { error: (err as Error).message });
    } finally {
      // With the status answered (a client gone midway included: its 400 is written, not sent).
      const seconds = (performance.now() - t0) / 1000;
      if (method !== undefined) this.#metrics.answered(route, req.method ?? '', res.statusCode, seconds);
      if (method !== undefined && this.#accessLog) {
        const trace = req.headers[this.#traceIdHeader];
        this.#accessLog.write({
          traceId: (Array.isArray(trace) ? trace[0] : trace) ?? null,
          method: req.method ?? '',
          path: route,
          model: answered.model,
          status: res.statusCode,
          durationMs: seconds * 1000,
        });
      }
    }
  }

  async #get(route: string, url: URL, res: ServerResponse): Promise<void> {
    switch (route) {
      case '/workers':
        return this.#send(
          res,
          200,
          this.#workers(url.searchParams.get('model_name'), url.searchParams.get('routing_group')),
        );
      case '/dump':
        try {
          return await this.#dump(res);
        } catch {
          // Headers are out: the client sees the connection end mid-answer.
          return void res.destroy();
        }
      case '/health':
        return this.#send(res, 200, this.#health());
      case '/peers':
        return this.#send(res, 200, this.peers.list());
      default: {
        const text = await this.#metrics.scrape();
        res.writeHead(200, { 'content-type': this.#metrics.prom.contentType });
        res.end(text);
      }
    }
  }

  async #post(route: string, f: Fields, answered: Answered): Promise<{ status: number; body: unknown }> {
    if (f.has('model_name')) {
      try {
        answered.model = f.str('model_name');
      } catch {}
    }
    switch (route) {
      case '/register':
        await this.#register(f);
        return { status: 201, body: { status: 'ok' } };
      case '/register_peer':
        this.peers.add(f.str('url'));
        return { status: 201, body: { status: 'ok' } };
      case '/deregister_peer':
        if (!this.peers.remove(f.str('url'))) throw new HttpError(404, 'peer not found');
        return { status: 200, body: { status: 'ok' } };
      case '/reopen_logs':
        this.#accessLog?.reopen();
        return { status: 200, body: { status: 'ok' } };
      case '/unregister':
        await this.registry.unregister(
          f.u64('instance_id'),
          f.str('model_name'),
          f.str('routing_group', null),
          f.has('dp_rank') ? f.u32('dp_rank') : null,
        );
        return { status: 200, body: { status: 'ok' } };
    }
    throw new HttpError(404, `no route ${route}`);
  }

  #query(q: Native.TokenQueryOut, answered: Answered): { status: number; body: unknown } {
    answered.model = q.modelName;
    const ix = this.registry.index(q.modelName, q.routingGroup ?? 'default');
    const m = ix.findMatches(q.tokenIds, { loraName: q.loraName ?? null, cacheSalt: q.cacheSalt ?? null });
    return { status: 200, body: queryAnswer(m, ix.blockSize) };
  }

  #queryByHash(q: Native.HashQueryOut, answered: Answered): { status: number; body: unknown } {
    answered.model = q.modelName;
    if (q.cacheSalt) {
      throw new HttpError(
        400,
        'cache_salt is not accepted by /query_by_hash; block_hashes must already include the intended cache salt',
      );
    }
    const ix = this.registry.index(q.modelName, q.routingGroup ?? 'default');
    return { status: 200, body: queryAnswer(ix.findMatchesByHash(q.blockHashes), ix.blockSize) };
  }

  async #register(f: Fields): Promise<void> {
    const instanceId = f.u64('instance_id');
    const modelName = f.name('model_name');
    const blockSize = f.u32('block_size');
    const routingGroup = f.name('routing_group', 'default') as string;
    const dpRank = f.u32('dp_rank', 0);
    const url = f.name('url', null);
    if (url !== null) nodeUrl(url);
    const engine = f.str('engine', 'vllm');
    if (engine !== 'vllm' && engine !== 'sglang' && engine !== 'trtllm') {
      throw new HttpError(400, `engine is ${JSON.stringify(engine)}: vllm, sglang or trtllm`);
    }
    let endpoint = f.has('endpoint') || url === null ? f.name('endpoint') : null;
    let replayEndpoint = f.name('replay_endpoint', null);
    if (endpoint !== null) checkEndpoint(endpoint);
    if (replayEndpoint !== null) {
      try {
        checkEndpoint(replayEndpoint);
      } catch (err) {
        throw new HttpError(400, `invalid replay endpoint \`${replayEndpoint}\`: ${(err as Error).message}`);
      }
    }
    if (endpoint === null && url !== null) ({ endpoint, replayEndpoint } = await discoverNode(url, this.#nodeToken));
    const r: Registration = {
      instanceId,
      dpRank,
      modelName,
      routingGroup,
      blockSize,
      endpoint: endpoint as string,
      replayEndpoint,
      url,
      engine,
    };
    this.registry.register(r, sourceOf(r, this.#nodeToken));
  }

  #workers(model: string | null, group: string | null): unknown[] {
    const out: unknown[] = [];
    for (const [id, inst] of this.registry.instances()) {
      if ((model !== null && inst.modelName !== model) || (group !== null && inst.routingGroup !== group)) continue;
      const ix = this.registry.index(inst.modelName, inst.routingGroup);
      const endpoints: Record<string, string> = {};
      const listeners: Record<string, unknown> = {};
      let blockSize = 0;
      const states: string[] = [];
      for (const [rank, r] of inst.ranks) {
        blockSize = r.blockSize;
        endpoints[rank] = r.endpoint;
        const s = ix.subscription(id, rank)?.stats();
        const status =
          s === undefined ? 'failed' : s.state === 'live' ? 'active' : s.state === 'closed' ? 'failed' : 'pending';
        states.push(status);
        listeners[rank] = {
          endpoint: r.endpoint,
          status,
          ...(s?.lastError ? { last_error: s.lastError } : {}),
          ...(r.url ? { url: r.url } : {}),
          ...(s ? { state: s.state, last_seq: s.lastSeq, recoveries: s.recoveries } : {}),
        };
      }
      const status = states.includes('failed') ? 'failed' : states.includes('pending') ? 'pending' : 'active';
      out.push({
        instance_id: id,
        source: [...inst.ranks.values()].some((r) => r.endpoint.startsWith('grpc://')) ? 'grpc' : 'zmq',
        status,
        model_name: inst.modelName,
        routing_group: inst.routingGroup,
        block_size: blockSize,
        endpoints,
        listeners,
      });
    }
    return out;
  }

  /**
   * Every index's blocks as Dynamo's `/dump` writes them (the JSON written by the core), streamed:
   * a large index is written a few thousand blocks at a time, each piece once the socket has
   * taken the last, so queries are answered in between.
   */
  async #dump(res: ServerResponse): Promise<void> {
    res.writeHead(200, { 'content-type': 'application/json' });
    if (res.req.method === 'HEAD') return void res.end();
    const write = async (piece: string | Buffer) => {
      if (!res.write(piece)) await new Promise((r) => res.once('drain', r));
      else await new Promise((r) => setImmediate(r));
    };
    let firstIndex = true;
    await write('{');
    for (const [key, ix] of this.registry.indexes()) {
      if (ix.closed) continue;
      await write(`${firstIndex ? '' : ','}${JSON.stringify(key)}:{"block_size":${ix.blockSize},"events":[`);
      firstIndex = false;
      for (const [i, piece] of ix.dumpJson(4096).entries()) {
        if (i > 0) res.write(',');
        await write(piece);
        if (res.destroyed) return;
      }
      await write(']}');
    }
    res.end('}');
  }

  #health(): Record<string, unknown> {
    const subs = this.registry.indexes().flatMap(([, ix]) => ix.subscriptionStats());
    const brief = (s: (typeof subs)[number]) => ({
      instance_id: s.workerId,
      dp_rank: s.dpRank,
      state: s.state,
      last_error: s.lastError,
    });
    const recovering = subs.filter((s) => s.state === 'recovering').map(brief);
    const stale = subs.filter((s) => s.state === 'connecting' || s.state === 'backoff').map(brief);
    const m = process.memoryUsage();
    const mib = (n: number) => Math.round(n / 1048576);
    return {
      status: recovering.length + stale.length === 0 ? 'ok' : 'degraded',
      workers: subs.length,
      recovering,
      stale,
      // The process's memory in MiB: resident, V8's heap in use, and outside it (Buffers).
      memory_mib: { rss: mib(m.rss), heap: mib(m.heapUsed), external: mib(m.external) },
      index_mib: mib(
        this.registry.indexes().reduce((a, [, ix]) => a + ix.stats().tiers.reduce((b, t) => b + t.bytes, 0), 0),
      ),
    };
  }

  #send(res: ServerResponse, status: number, body: unknown, exact = true): void {
    if (res.headersSent) return;
    const text = exact ? jsonExact(body) : JSON.stringify(body);
    res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(res.req.method === 'HEAD' ? undefined : text);
  }

  /** Stops serving and following every worker (`signal`: stop waiting; the close goes on). */
  async close(options: AbortOptions = {}): Promise<void> {
    this.#server.closeAllConnections();
    await runThenAbortable(options.signal, async () => {
      await new Promise<void>((resolve) => this.#server.close(() => resolve()));
      await this.registry.close();
      await this.#accessLog?.close();
    });
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** The body of a JSON request, at most `limit` bytes (413 past it; 415 without a JSON content type). */
/** A JSON body's fields, long integers exact (queries' bodies are read by the core). */
function fieldsOf(bytes: Buffer): Fields {
  let text: string;
  try {
    text = UTF8.decode(bytes);
  } catch {
    throw new HttpError(400, 'the request body is not valid UTF-8');
  }
  return Fields.of(parseJsonExact(text));
}

/** How far past its limit a body is read (and dropped) before it is answered 413. */
const DRAIN_BYTES = 64 * 1024 * 1024;

async function readJson(req: IncomingMessage, limit: number): Promise<Buffer> {
  const type = req.headers['content-type'] ?? '';
  // JSON, or a type of its (`application/problem+json`): what Dynamo's indexer takes.
  if (!/^application\/([\w.!#$&^-]+\+)?json\s*(;|$)/i.test(type)) {
    req.resume();
    throw new HttpError(415, 'Expected request with `Content-Type: application/json`');
  }
  const over = () => new HttpError(413, `request body over ${limit} bytes`);
  // A body over the limit is read on to its end (dropped), so that a client still sending it
  // reads the answer rather than a connection reset; one over it by more than `DRAIN_BYTES` is
  // answered at once (its connection is then closed).
  if (Number(req.headers['content-length'] ?? 0) > limit + DRAIN_BYTES) {
    req.resume();
    throw over();
  }
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size <= limit) chunks.push(chunk);
      else {
        chunks.length = 0;
        if (size > limit + DRAIN_BYTES) reject(over());
      }
    });
    req.on('end', () => (size > limit ? reject(over()) : resolve(Buffer.concat(chunks))));
    // The client went away mid-body: its error, not the server's (and it reads no answer).
    req.on('error', (err) => reject(new HttpError(400, `request body cut short: ${err.message}`)));
  });
}

/** Refuses bytes that are not UTF-8 (as a JSON parser over bytes does), rather than replacing them. */
const UTF8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });
