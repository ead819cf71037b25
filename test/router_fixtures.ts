import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { IndexerServer, type IndexerServerOptions, type KvEvent, KvEventPublisher, SimEngine } from '../dist/index.mjs';
import { freePort, sleep, until } from './fixtures.js';

/** A parsed JSON answer, read field by field. */
// biome-ignore lint/suspicious/noExplicitAny: JSON answers, read field by field
type Json = any;

/** POSTs JSON; the status and the parsed answer. */
export async function post(
  base: string,
  path: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<{ status: number; json: Json }> {
  const res = await fetch(`${base}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body:
      typeof body === 'string'
        ? body
        : body instanceof Uint8Array
          ? Buffer.from(body)
          : JSON.stringify(body, (_k, v) => (typeof v === 'bigint' ? Number(v) : v)),
  });
  const text = await res.text();
  let json: unknown = null;
  try {
    json = text === '' ? null : JSON.parse(text);
  } catch {
    json = text;
  }
  return { status: res.status, json };
}

export interface DynamoIndexer {
  url: string;
  proc: ChildProcess;
  /** What it wrote to stderr (its log), the last 64 KB. */
  log(): string;
  stop(): Promise<void>;
}

/** Terminal colour codes (Dynamo's log has them). */
const ANSI_COLOUR = new RegExp(`${String.fromCharCode(27)}\\[[0-9;]*m`, 'g');

/** Whether Dynamo's standalone indexer (PyPI ai-dynamo-runtime) runs here. */
export function dynamoAvailable(): boolean {
  const r = spawnSync('python3', ['-c', 'import dynamo._core'], { stdio: 'ignore' });
  return r.status === 0;
}

/** `python3 -m dynamo.indexer` on a free port, once its `/health` answers. */
export async function startDynamoIndexer(threads = 1, args: readonly string[] = []): Promise<DynamoIndexer> {
  const port = await freePort();
  const proc = spawn(
    'python3',
    ['-m', 'dynamo.indexer', '--port', String(port), '--threads', String(threads), ...args],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  const exited = new Promise((r) => proc.on('exit', r));
  // Read (a full pipe would stall it), the last 64 KB kept without colour codes.
  let log = '';
  proc.stderr?.on('data', (d: Buffer) => {
    log = (log + d.toString().replace(ANSI_COLOUR, '')).slice(-65536);
  });
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 200; i++) {
    try {
      if ((await fetch(`${url}/health`)).ok) break;
    } catch {
      await sleep(50);
    }
  }
  return {
    url,
    proc,
    log: () => log,
    async stop() {
      proc.kill('SIGTERM');
      await exited;
    },
  };
}

export interface SimNode {
  id: bigint;
  publisher: KvEventPublisher;
  sim: SimEngine;
  endpoint: string;
  replayEndpoint: string;
}

/** `n` simulated engine nodes in this process, each a vLLM-format publisher with replay, stepped by hand. */
export async function simNodes(n: number, blockSize: number, seed = 1): Promise<SimNode[]> {
  const nodes: SimNode[] = [];
  for (let i = 0; i < n; i++) {
    const publisher = await KvEventPublisher.create({
      endpoint: 'tcp://127.0.0.1:*',
      replayEndpoint: 'tcp://127.0.0.1:*',
      dataParallelRank: 0,
      blockSize,
    });
    const sim = new SimEngine(publisher, {
      seed: seed * 1000 + i,
      blockSize,
      numBlocks: 1024,
      requestsPerSecond: 200,
      // Few prompts and documents, so the nodes share prefixes at many depths.
      systemPrompts: 4,
      documents: 20,
    });
    nodes.push({
      id: BigInt(i + 1),
      publisher,
      sim,
      endpoint: publisher.endpoint,
      replayEndpoint: publisher.replayEndpoint as string,
    });
  }
  return nodes;
}

/** Steps every node `steps` times, flushing each step. */
export async function run(nodes: readonly SimNode[], steps: number): Promise<void> {
  for (let s = 0; s < steps; s++) {
    for (const node of nodes) {
      node.sim.step();
      await node.publisher.flush();
    }
  }
}

/** A small seeded generator (mulberry32). */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * Requests that hit the nodes' caches at many depths: each is the full token prefix of a block
 * some node holds (from its tree dump), cut at a random block, with random tokens after it; a
 * tenth are random tokens only.
 */
export function queriesFrom(nodes: readonly SimNode[], count: number, blockSize: number, seed: number): Uint32Array[] {
  const prefixes: Uint32Array[] = [];
  for (const node of nodes) {
    const dump = node.publisher.indexer.getEvents();
    if (dump.kind !== 'TreeDump') throw new Error(`expected a TreeDump, got ${dump.kind}`);
    const upTo = new Map<bigint, Uint32Array>();
    for (const w of dump.workers) {
      for (const ev of w.events) {
        const start = ev.parentBlockHash === undefined ? new Uint32Array(0) : upTo.get(ev.parentBlockHash);
        if (start === undefined) continue;
        let base: Uint32Array = start;
        const hashes = ev.blockHashes as BigUint64Array;
        const tokens = ev.tokenIds as Uint32Array;
        for (let i = 0; i < hashes.length; i++) {
          const next: Uint32Array = new Uint32Array(base.length + blockSize);
          next.set(base);
          next.set(tokens.subarray(i * blockSize, (i + 1) * blockSize), base.length);
          base = next;
          upTo.set(hashes[i] as bigint, base);
          prefixes.push(base);
        }
      }
    }
  }
  const r = rng(seed);
  const out: Uint32Array[] = [];
  for (let q = 0; q < count; q++) {
    const tail = Array.from({ length: Math.floor(r() * 3 * blockSize) }, () => Math.floor(r() * 32000));
    if (r() < 0.1 || prefixes.length === 0) {
      out.push(Uint32Array.from(tail.concat(tail)));
      continue;
    }
    const p = prefixes[Math.floor(r() * prefixes.length)] as Uint32Array;
    const blocks = 1 + Math.floor(r() * (p.length / blockSize));
    out.push(Uint32Array.from([...p.subarray(0, blocks * blockSize), ...tail]));
  }
  return out;
}

/** An answer's `scores` and `instances` with keys sorted, for comparing two indexers' answers. */
// biome-ignore lint/suspicious/noExplicitAny: JSON answers, read field by field
export function canonical(answer: any): string {
  // biome-ignore lint/suspicious/noExplicitAny: JSON answers, read field by field
  const sort = (v: any): any =>
    v && typeof v === 'object' && !Array.isArray(v)
      ? Object.fromEntries(
          Object.keys(v)
            .sort()
            .map((k) => [k, sort(v[k])]),
        )
      : v;
  return JSON.stringify(sort({ scores: answer.scores, instances: answer.instances }));
}

/** Per index, worker, rank and tier, the blocks an indexer's `/dump` holds, sorted. */
export async function dumpCounts(base: string): Promise<Array<[string, number]>> {
  const d = (await (await fetch(`${base}/dump`)).json()) as Record<string, { events: Json[] }>;
  const out: Record<string, number> = {};
  for (const [name, part] of Object.entries(d)) {
    for (const e of part.events) {
      const key = `${name}/${e.worker_id}:${e.event.dp_rank}:${e.storage_tier}`;
      out[key] = (out[key] ?? 0) + e.event.data.stored.blocks.length;
    }
  }
  return Object.entries(out).sort();
}

/**
 * Blocks on three tiers (each lower tier's first block the child of the one above) and under a
 * LoRA adapter, published by `node` as a vLLM engine would: their tokens.
 */
export function tieredAndLora(node: SimNode, blockSize: number): Uint32Array {
  const tokens = Uint32Array.from({ length: 5 * blockSize }, (_, i) => 900_000 + i);
  const block = (i: number) => tokens.subarray(i * blockSize, (i + 1) * blockSize);
  const ev = (hashes: number[], parent: number | null, from: number, medium: string, loraName?: string): KvEvent => ({
    type: 'stored',
    blockHashes: hashes.map(BigInt),
    parentBlockHash: parent === null ? null : BigInt(parent),
    tokenIds: Uint32Array.from(hashes.flatMap((_, i) => [...block(from + i)])),
    blockSize,
    medium,
    ...(loraName ? { loraName } : {}),
  });
  node.publisher.publish([
    ev([9001, 9002], null, 0, 'GPU'),
    ev([9003], 9002, 2, 'CPU'),
    ev([9004], 9003, 3, 'STORAGE'),
    ev([9101, 9102], null, 0, 'GPU', 'adapter-a'),
  ]);
  return tokens;
}

/**
 * Registers every node with each indexer at `bases`, model `m`, once per routing group (a node's
 * instance id plus 100 per group after the first), with its replay socket.
 */
export async function registerEverywhere(
  bases: readonly string[],
  nodes: readonly SimNode[],
  blockSize: number,
  groups: readonly string[] = ['default'],
): Promise<void> {
  for (const n of nodes) {
    for (const [g, group] of groups.entries()) {
      for (const base of bases) {
        const r = await post(base, '/register', {
          instance_id: Number(n.id) + 100 * g,
          endpoint: n.endpoint,
          replay_endpoint: n.replayEndpoint,
          model_name: 'm',
          routing_group: group,
          block_size: blockSize,
        });
        if (r.status !== 201) throw new Error(`${base}/register: ${r.status} ${JSON.stringify(r.json)}`);
      }
    }
  }
}

/**
 * Quiescence: kvplane's indexer `ours` has applied every node's last batch (index `m:default`),
 * and every indexer at `bases` holds the same blocks as it (`dumpCounts`).
 */
export async function settled(ours: IndexerServer, nodes: readonly SimNode[], bases: readonly string[]): Promise<void> {
  const ix = ours.registry.index('m', 'default');
  await until(
    () => nodes.every((n) => ix.subscription(n.id)?.stats().lastSeq === n.publisher.stats().lastSeq),
    'kvplane caught up',
  );
  const mine = JSON.stringify(await dumpCounts(ours.url));
  for (const base of bases) {
    let theirs = '';
    for (let i = 0; i < 100 && theirs !== mine; i++) {
      if (i > 0) await sleep(100);
      theirs = JSON.stringify(await dumpCounts(base));
    }
    if (theirs !== mine) throw new Error(`${base} holds other blocks than kvplane: ${theirs} against ${mine}`);
  }
}

/**
 * `nodes` simulated nodes followed by Dynamo's indexer and kvplane's side by side (`ours`, with
 * `opts`), each registered in every routing group of `groups`: `steps` steps published, then the
 * tiered and LoRA blocks on node `extraOn`, then a quarter as many steps, until both hold the same
 * blocks. Each is pushed to `cleanup`.
 */
export async function followedSideBySide(
  cleanup: Array<() => unknown>,
  o: {
    nodes: number;
    seed: number;
    steps: number;
    blockSize: number;
    extraOn: number;
    groups?: readonly string[];
    opts?: Omit<IndexerServerOptions, 'host' | 'port'>;
  },
): Promise<{ nodes: SimNode[]; dynamo: DynamoIndexer; ours: IndexerServer; extra: Uint32Array }> {
  const nodes = await simNodes(o.nodes, o.blockSize, o.seed);
  cleanup.push(() => Promise.all(nodes.map((n) => n.publisher.close())));
  const dynamo = await startDynamoIndexer(1);
  cleanup.push(() => dynamo.stop());
  const ours = await IndexerServer.create({ host: '127.0.0.1', port: 0, ...o.opts });
  cleanup.push(() => ours.close());
  await registerEverywhere([dynamo.url, ours.url], nodes, o.blockSize, o.groups);
  await sleep(500);
  await run(nodes, o.steps);
  const extra = tieredAndLora(nodes[o.extraOn] as SimNode, o.blockSize);
  await run(nodes, o.steps / 4);
  await settled(ours, nodes, [dynamo.url]);
  return { nodes, dynamo, ours, extra };
}
