import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort, repoPath, runGrpcPeer, type ServeNode, serveNode, sleep, TcpLink } from './fixtures.js';

// The real SMG gateway (PyPI smg 1.13.0) routing with --policy cache_aware on two workers, each
// a kvplane relay (`kvplane serve --engine vllm --grpc-upstream`) in front of an engine stand-in
// that speaks SMG's vLLM servicer and publishes its KV events through vLLM's own publisher
// (scripts/smg_engine.py). SMG reaches each worker at kvplane's gRPC port only.

const cleanup: Array<() => unknown> = [];
afterAll(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

/** A child process whose output lines are kept; stopped at the end. */
function run(cmd: string, args: string[]): { proc: ChildProcess; out: string[] } {
  const proc = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  const out: string[] = [];
  // Without the terminal colours of SMG's log.
  const colours = new RegExp(`${String.fromCharCode(27)}\\[[0-9;]*m`, 'g');
  for (const s of [proc.stdout, proc.stderr]) {
    createInterface({ input: s as NodeJS.ReadableStream }).on('line', (l) => out.push(l.replace(colours, '')));
  }
  const exited = new Promise((r) => proc.once('exit', r));
  cleanup.push(async () => {
    proc.kill('SIGKILL');
    await exited;
  });
  return { proc, out };
}

async function waitFor<T>(what: string, f: () => Promise<T | undefined> | T | undefined, ms = 30_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

/** `tK` words for ids `from .. from + n - 1`. */
const words = (from: number, n: number) => Array.from({ length: n }, (_, i) => `t${from + i}`).join(' ');

interface Worker {
  engine: { out: string[]; grpc: string };
  node: ServeNode;
  /** kvplane's gRPC address. */
  url: string;
  /** Where SMG reaches it: `url`, or through a `TcpLink` that can be cut. */
  smgUrl: string;
  link?: TcpLink;
  http: string;
}

/** Blocks in a relay's index. */
async function relayBlocks(w: Worker): Promise<number> {
  const d = (await (await fetch(`${w.http}/kv_recover`)).json()) as {
    TreeDump: { workers: Array<{ events: Array<{ block_hashes: number[] }> }> };
  };
  return d.TreeDump.workers.reduce((n, x) => n + x.events.reduce((m, e) => m + e.block_hashes.length, 0), 0);
}

/** `smg_kv_index_blocks` per worker URL from SMG's metrics. */
async function smgIndexBlocks(metrics: string): Promise<Record<string, number>> {
  const text = await (await fetch(metrics)).text();
  const out: Record<string, number> = {};
  for (const m of text.matchAll(/^smg_kv_index_blocks\{[^}]*worker="([^"]+)"[^}]*\} (\S+)$/gm)) {
    out[m[1] as string] = Number(m[2]);
  }
  return out;
}

describe('the SMG gateway routes on kvplane', () => {
  const workers: Worker[] = [];
  let gateway: string;
  /** When SMG was launched (it polls GetLoads every 10 s unless records flow). */
  let smgStarted = 0;
  let metrics: string;
  let smg: { out: string[] };

  beforeAll(async () => {
    const tok = mkdtempSync(join(tmpdir(), 'kvplane-tok-'));
    execFileSync('python3', [repoPath('scripts/build_tokenizer.py'), tok]);
    for (let i = 0; i < 2; i++) {
      const engine = run('python3', [repoPath('scripts/smg_engine.py'), '--block-size', '16', '--verbose']);
      const ready = JSON.parse(
        await waitFor('the engine stand-in', () => engine.out.find((l) => l.startsWith('{'))),
      ) as { grpc: string; zmq: string; replay: string };
      const node = await serveNode(
        [
          '--engine',
          'vllm',
          '--engine-endpoint',
          ready.zmq,
          '--engine-replay-endpoint',
          ready.replay,
          '--grpc-host',
          '127.0.0.1',
          '--grpc-port',
          '0',
          '--grpc-upstream',
          ready.grpc,
          '--http-port',
          '0',
          // Worker 0's relay keeps a short log, so a subscriber away for a few batches is expired.
          ...(i === 0 ? ['--buffer-steps', '4'] : []),
        ],
        cleanup,
      );
      const url = `127.0.0.1:${node.serving.grpc_port}`;
      const link = i === 0 ? await TcpLink.open(Number(node.serving.grpc_port)) : undefined;
      if (link) cleanup.push(() => link.cut());
      const smgUrl = link ? `127.0.0.1:${link.port}` : url;
      workers.push({
        engine: { out: engine.out, grpc: ready.grpc },
        node,
        url,
        smgUrl,
        link,
        http: node.serving.http as string,
      });
    }
    // Each engine caches a 64-token prompt (4 blocks) before the gateway exists: requests sent
    // through its kvplane relay, as the gateway will send them.
    for (const [i, w] of workers.entries()) {
      expect(await runGrpcPeer(['generate', w.url, words(1000 * (i + 1), 64)])).toEqual([{ outputs: 1 }]);
    }
    for (const w of workers)
      await waitFor('the relay to index the prefix', async () => ((await relayBlocks(w)) === 4 ? true : undefined));

    const port = await freePort();
    const prom = await freePort();
    smgStarted = Date.now();
    smg = run('smg', [
      'launch',
      '--host',
      '127.0.0.1',
      '--port',
      String(port),
      '--worker-urls',
      ...workers.map((w) => `grpc://${w.smgUrl}`),
      '--policy',
      'cache_aware',
      '--block-size',
      '16',
      '--tokenizer-path',
      tok,
      '--log-level',
      'debug',
      '--prometheus-host',
      '127.0.0.1',
      '--prometheus-port',
      String(prom),
      '--worker-warmup-secs',
      '0',
      '--worker-warmup-divert-every',
      '0',
    ]);
    gateway = `http://127.0.0.1:${port}`;
    metrics = `http://127.0.0.1:${prom}/metrics`;
  }, 120_000);

  it('registers both workers through kvplane and takes their cached prefixes from the snapshot', async () => {
    // SMG's index equals kvplane's: 4 blocks per worker, though both were cached before SMG ran.
    const want = Object.fromEntries(workers.map((w) => [`grpc://${w.smgUrl}`, 4]));
    const got = await waitFor(
      'SMG to index both workers',
      async () => {
        const blocks = await smgIndexBlocks(metrics).catch(() => ({}) as Record<string, number>);
        const same = Object.keys(want).every((k) => blocks[k] === want[k]) && Object.keys(blocks).length === 2;
        return same ? blocks : undefined;
      },
      60_000,
    ).catch(async (err) => {
      throw new Error(
        `${err}: SMG has ${JSON.stringify(await smgIndexBlocks(metrics).catch(() => ({})))}; log:\n${smg.out.slice(-40).join('\n')}`,
      );
    });
    expect(got).toEqual(want);
    const snapshots = smg.out.filter((l) => l.includes('KV event relay snapshot applied'));
    expect(snapshots).toHaveLength(2);
  }, 90_000);

  it('sends requests extending a cached prefix to the worker that holds it (event_hit)', async () => {
    for (let round = 0; round < 3; round++) {
      for (let i = 0; i < workers.length; i++) {
        // The cached 64 tokens, then 16 new ones (a block neither engine holds).
        const prompt = `${words(1000 * (i + 1), 64)} ${words(20_000 + 100 * round + 20 * i, 16)}`;
        const res = await fetch(`${gateway}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'kvplane-test', prompt, max_tokens: 2 }),
        });
        expect(res.status).toBe(200);
        const body = (await res.json()) as { choices: Array<{ text: string }> };
        expect(body.choices[0]?.text.trim().split(' ')).toHaveLength(2);
      }
    }
    // Every request reached the engine holding its prefix, which found 4 blocks cached.
    for (const w of workers) {
      const lines = w.engine.out.filter((l) => l.includes('Generate') && l.includes('80 tokens'));
      expect(lines).toHaveLength(3);
      expect(lines.every((l) => l.includes('4 cached'))).toBe(true);
    }
    // SMG chose each worker from its KV-event index: event_hit, 4 blocks matched of 5.
    const hits = smg.out.filter((l) => l.includes('Event-driven routing') && l.includes('branch="event_hit"'));
    expect(hits).toHaveLength(6);
    expect(hits.every((l) => l.includes('overlap_blocks=4'))).toBe(true);
    for (const w of workers) expect(hits.filter((l) => l.includes(`worker="grpc://${w.smgUrl}"`))).toHaveLength(3);
  }, 60_000);

  it('after an expired cursor SMG resyncs to the whole index from a snapshot', async () => {
    const w = workers[0] as Worker;
    const key = `grpc://${w.smgUrl}`;
    await w.link?.cut(); // SMG's stream to worker 0 breaks; it keeps its index and its cursor
    // Meanwhile the engine caches 6 more prompts (6 batches): the relay's 4-batch log rolls past
    // SMG's cursor.
    for (let k = 0; k < 6; k++) {
      expect(await runGrpcPeer(['generate', w.url, words(5000 + 100 * k, 32)])).toEqual([{ outputs: 1 }]);
    }
    const relayed = await waitFor('the relay to index them', async () => {
      const n = await relayBlocks(w);
      return n >= 4 + 6 * 2 ? n : undefined;
    });
    await w.link?.restore();
    // SMG resubscribes from its cursor: OUT_OF_RANGE, then from 0, and a snapshot of everything.
    const blocks = await waitFor(
      'SMG to resync worker 0',
      async () => {
        const b = (await smgIndexBlocks(metrics).catch(() => ({}) as Record<string, number>))[key];
        return b === relayed ? b : undefined;
      },
      60_000,
    ).catch(async (err) => {
      throw new Error(
        `${err}: SMG has ${JSON.stringify(await smgIndexBlocks(metrics).catch(() => ({})))}, kvplane ${relayed}; log:\n${smg.out
          .filter((l) => /resync|snapshot|Failed to subscribe|SubscribeKvEvents|out_of_range/i.test(l))
          .slice(-20)
          .join('\n')}`,
      );
    });
    expect(blocks).toBe(relayed);
    // SMG's own account: its cursor expired (OUT_OF_RANGE), it cleared the worker and asked for a snapshot.
    expect(
      smg.out.some((l) => l.includes('KV event replay cursor expired; clearing worker state') && l.includes(w.smgUrl)),
    ).toBe(true);
    expect(smg.out.filter((l) => l.includes('KV event relay snapshot applied') && l.includes(key))).toHaveLength(2);
  }, 90_000);

  it('takes each engine’s load from kvplane’s load records instead of polling GetLoads', async () => {
    // Past SMG's 10 s GetLoads interval: a worker whose stream carries records is not polled.
    await sleep(Math.max(0, smgStarted + 12_000 - Date.now()));
    const text = await (await fetch(metrics)).text();
    const series = (name: string, worker: string, label: string) =>
      Number(
        new RegExp(`^${name}\\{[^}]*worker="grpc://${worker}"[^}]*${label}[^}]*\\} (\\S+)$`, 'm').exec(text)?.[1] ?? 0,
      );
    for (const w of workers) {
      // The idle streams' records: load_only batches about every second.
      expect(series('smg_kv_event_batches_total', w.smgUrl, 'disposition="load_only"')).toBeGreaterThanOrEqual(5);
      // At most the one poll SMG makes as it registers a worker, before the first record.
      expect(series('smg_engine_load_polls_total', w.smgUrl, 'mode="poll"')).toBeLessThanOrEqual(1);
    }
    // What SMG holds per worker is the engine's GetLoads answer (its capacity: 8192 blocks of 16).
    const loads = (await (await fetch(`${gateway}/loads`)).json()) as {
      loads: Array<{ worker: string; max_total_num_tokens: number; max_running_requests: number }>;
    };
    for (const w of workers) {
      expect(loads.loads.find((l) => l.worker === `grpc://${w.smgUrl}`)).toMatchObject({
        max_total_num_tokens: 8192 * 16,
        max_running_requests: 256,
      });
    }
  }, 30_000);
});
