import { type ChildProcess, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type { ExtraKey, HashAlgo, HashBlocksOptions, KvEvent } from '../src/index.js';

export function repoPath(rel: string): string {
  return fileURLToPath(new URL(`../${rel}`, import.meta.url));
}

export function readJson<T>(rel: string): T {
  return JSON.parse(readFileSync(repoPath(rel), 'utf8')) as T;
}

type FixtureExtraKey = { str: string } | { int: string } | { bytes_hex: string } | { tuple: FixtureExtraKey[] };

export interface HashFixture {
  name: string;
  algo: HashAlgo;
  tokens: number[];
  block_size: number;
  options?: {
    parent_hex?: string;
    parent?: string;
    lora_name?: string;
    lora_id?: string;
    cache_salt?: string;
    cache_salt_id?: string;
    none_hash_seed?: string;
    extra_keys?: FixtureExtraKey[];
    first_block_extra_keys?: FixtureExtraKey[];
  };
  hashes: string[];
  digests?: string[];
  signed?: string[];
}

function extraKey(k: FixtureExtraKey): ExtraKey {
  if ('str' in k) return k.str;
  if ('int' in k) return BigInt(k.int);
  if ('bytes_hex' in k) return Buffer.from(k.bytes_hex, 'hex');
  return k.tuple.map(extraKey);
}

/** The fixture's options in the TS API's shape. `saltAsId` uses the precomputed salt id. */
export function fixtureOptions(f: HashFixture, saltAsId = false): HashBlocksOptions {
  const o = f.options ?? {};
  const opts: HashBlocksOptions = { algo: f.algo, blockSize: f.block_size };
  if (o.parent_hex !== undefined) opts.parent = Buffer.from(o.parent_hex, 'hex');
  if (o.parent !== undefined) opts.parent = BigInt(o.parent);
  if (o.lora_name !== undefined) opts.loraName = o.lora_name;
  if (o.lora_id !== undefined) opts.loraId = BigInt(o.lora_id);
  if (o.none_hash_seed !== undefined) opts.noneHashSeed = o.none_hash_seed;
  if (o.cache_salt !== undefined && !(saltAsId && o.cache_salt_id !== undefined)) opts.cacheSalt = o.cache_salt;
  else if (o.cache_salt_id !== undefined) opts.cacheSaltId = BigInt(o.cache_salt_id);
  if (o.extra_keys !== undefined) opts.extraKeys = o.extra_keys.map(extraKey);
  if (o.first_block_extra_keys !== undefined) opts.firstBlockExtraKeys = o.first_block_extra_keys.map(extraKey);
  return opts;
}

/**
 * Stream options for tests that count seqs from 1 and check every batch's content: no clock-based
 * first seq and no opening clear (test/restart.test.ts covers those defaults).
 */
export const FROM_SEQ_1 = { firstSeq: 1n, openWithClear: false } as const;

/** Runs `scripts/grpc_peer.py` (grpcio with SMG's published stubs); its JSON lines. */
export function runGrpcPeer(args: string[]): Promise<Array<Record<string, unknown>>> {
  return new Promise((resolve, reject) => {
    const p = spawn('python3', [repoPath('scripts/grpc_peer.py'), ...args]);
    let out = '';
    let err = '';
    p.stdout.on('data', (d) => (out += d));
    p.stderr.on('data', (d) => (err += d));
    p.on('error', reject);
    p.on('close', (code) =>
      code === 0
        ? resolve(
            out
              .trim()
              .split('\n')
              .map((l) => JSON.parse(l)),
          )
        : reject(new Error(`grpc_peer.py exited ${code}: ${err}`)),
    );
  });
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Resident bytes of a process, read from /proc. */
export function rss(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m?.[1]) * 1024;
}

export interface ServeNode {
  proc: ChildProcess;
  lines: Array<Record<string, unknown>>;
  serving: Record<string, string>;
  /** The newest status line. */
  status(): Record<string, unknown>;
}

/**
 * `kvplane serve` (the simulated engine by default) in its own process, on loopback with ports the
 * OS picks and a status line every 0.2 s; stopped by `cleanup`.
 */
export async function serveNode(args: string[], cleanup: Array<() => unknown>): Promise<ServeNode> {
  const proc = spawn(process.execPath, [
    repoPath('dist/cli.js'),
    'serve',
    '--endpoint',
    'tcp://127.0.0.1:*',
    '--replay-endpoint',
    'tcp://127.0.0.1:*',
    '--http-port',
    'none',
    '--status-interval',
    '0.2',
    ...args,
  ]);
  const exited = new Promise((resolve) => proc.on('exit', resolve));
  cleanup.push(async () => {
    proc.kill('SIGTERM');
    await exited;
  });
  const lines: Array<Record<string, unknown>> = [];
  createInterface({ input: proc.stdout as NodeJS.ReadableStream }).on('line', (l) => lines.push(JSON.parse(l)));
  for (let i = 0; i < 400 && !lines.some((l) => l.msg === 'serving'); i++) await sleep(25);
  const serving = lines.find((l) => l.msg === 'serving') as Record<string, string>;
  if (serving === undefined) throw new Error(`kvplane serve did not start: ${JSON.stringify(lines)}`);
  const status = () => [...lines].reverse().find((l) => l.msg === 'status') ?? {};
  return { proc, lines, serving, status };
}

export async function until(cond: () => boolean, what: string, ms = 30_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

/** A one-block stored event: hash `hash`, 16 tokens all equal to it, under `parent`. */
export const storedBlock = (hash: number, parent: number | null): KvEvent => ({
  type: 'stored',
  blockHashes: [BigInt(hash)],
  parentBlockHash: parent === null ? null : BigInt(parent),
  tokenIds: new Uint32Array(16).fill(hash),
  blockSize: 16,
});

export interface RecoveredBatch {
  seq: number;
  ts: number;
  dp_rank: number | null;
  events: Array<{ type: string; block_hashes?: number[] }>;
}

/** The ranks of a relay's engine source, as its /healthz reports them. */
export async function engineRanks(http: string): Promise<Array<Record<string, unknown>>> {
  const health = (await (await fetch(`${http}/healthz`)).json()) as {
    sources: Array<{ stats: { ranks: Array<Record<string, unknown>> } }>;
  };
  return health.sources[0]?.stats.ranks ?? [];
}

/** Every batch the relay has published so far, from its own log (`/kv_recover` Events). */
export async function relayed(http: string): Promise<RecoveredBatch[]> {
  const out: RecoveredBatch[] = [];
  const health = (await (await fetch(`${http}/healthz`)).json()) as { oldest_seq: number };
  let start = health.oldest_seq;
  for (;;) {
    const res = (await (await fetch(`${http}/kv_recover?start=${start}`)).json()) as {
      Events?: { batches: RecoveredBatch[]; next_start?: number };
    };
    if (res.Events === undefined) throw new Error(`kv_recover?start=${start}: ${JSON.stringify(res)}`);
    out.push(...res.Events.batches);
    if (res.Events.next_start === undefined) return out;
    start = res.Events.next_start;
  }
}

/**
 * Bytes written as they are to an HTTP server at `url` (a request Node's own client would not
 * send; several, 100 ms apart), and its answer read until it closes the connection: the first
 * answer's status, content type and body, and all that was read.
 */
export function rawHttp(
  url: string,
  request: string | string[],
): Promise<{ status: number; type: string; body: string; raw: string }> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, async () => {
      for (const [i, part] of [request].flat().entries()) {
        if (i > 0) await new Promise((r) => setTimeout(r, 100));
        socket.write(part);
      }
    });
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.on('error', reject);
    socket.on('close', () => {
      const text = Buffer.concat(chunks).toString('utf8');
      const [head = '', body = ''] = text.split('\r\n\r\n');
      resolve({
        status: Number(head.split(' ')[1]),
        type: /^content-type: *([^;\r]*)/im.exec(head)?.[1] ?? '',
        body,
        raw: text,
      });
    });
  });
}

/** A TCP port free on loopback now. */
export async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const { port } = srv.address() as { port: number };
  await new Promise((r) => srv.close(r));
  return port;
}

/**
 * A TCP forwarder on a fixed loopback port, for network faults: `cut()` drops every connection
 * and accepts none until `restore()`; `drop()` drops the connections open now; `stall()` stops
 * reading from the target (its writes back up as a slow peer's would) until `resume()`.
 */
export class TcpLink {
  readonly port: number;
  readonly #target: () => number;
  #server: Server | null = null;
  readonly #pairs = new Set<[Socket, Socket]>();
  #stalled = false;

  private constructor(port: number, target: () => number) {
    this.port = port;
    this.#target = target;
  }

  /** A link to the port `target` names when a connection arrives (it may change on restarts). */
  static async open(target: number | (() => number)): Promise<TcpLink> {
    const link = new TcpLink(await freePort(), typeof target === 'number' ? () => target : target);
    await link.restore();
    return link;
  }

  async restore(): Promise<void> {
    const server = createServer((client) => {
      const upstream = connect(this.#target(), '127.0.0.1');
      const pair: [Socket, Socket] = [client, upstream];
      this.#pairs.add(pair);
      if (this.#stalled) upstream.pause();
      client.pipe(upstream);
      upstream.pipe(client);
      const end = () => {
        this.#pairs.delete(pair);
        client.destroy();
        upstream.destroy();
      };
      for (const s of pair) s.on('error', end).on('close', end);
    });
    await new Promise<void>((r) => server.listen(this.port, '127.0.0.1', r));
    this.#server = server;
  }

  drop(): void {
    for (const [c, u] of this.#pairs) {
      c.destroy();
      u.destroy();
    }
    this.#pairs.clear();
  }

  async cut(): Promise<void> {
    const server = this.#server;
    this.#server = null;
    this.drop();
    if (server) await new Promise((r) => server.close(r));
  }

  stall(): void {
    this.#stalled = true;
    for (const [, u] of this.#pairs) u.pause();
  }

  resume(): void {
    this.#stalled = false;
    for (const [, u] of this.#pairs) u.resume();
  }
}
