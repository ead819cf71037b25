import { type ChildProcess, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { afterEach, describe, expect, it } from 'vitest';
import { Dealer, Subscriber } from 'zeromq';
import { repoPath } from './fixtures.js';

const CLI = repoPath('dist/cli.js');
const MiB = 1024 * 1024;
const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Resident bytes of a process, read from /proc. */
function rss(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m?.[1]) * 1024;
}

interface Node {
  proc: ChildProcess;
  lines: Array<Record<string, unknown>>;
  serving: Record<string, string>;
  /** The newest status line. */
  status(): Record<string, unknown>;
}

/** `kvplane serve` with the simulated engine at a high rate, in its own process. */
async function serve(args: string[]): Promise<Node> {
  const proc = spawn(process.execPath, [
    CLI,
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
  expect(serving).toBeDefined();
  const status = () => [...lines].reverse().find((l) => l.msg === 'status') ?? {};
  return { proc, lines, serving, status };
}

async function until(cond: () => boolean, what: string, ms = 30_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

const seq8 = (n: bigint) => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(n);
  return b;
};

describe('per-consumer byte budgets', () => {
  it('8 replay peers that ask for the whole log and never read hold at most their send budgets', async () => {
    const steps = 600;
    const node = await serve(['--buffer-steps', String(steps), '--sim-rate', '2000', '--sim-blocks', '65536']);
    const pid = node.proc.pid as number;
    await until(() => Number(node.status().batches ?? 0) >= steps + 40, 'a full replay log');
    await sleep(300);
    const before = rss(pid);
    const peers = Array.from({ length: 8 }, () => {
      const d = new Dealer({ receiveHighWaterMark: 1, linger: 0 });
      cleanup.push(() => d.close());
      d.connect(node.serving.replay_endpoint as string);
      return d;
    });
    for (const d of peers) await d.send([Buffer.alloc(0), seq8(1n)]);
    await until(() => Number(node.status().replay_requests ?? 0) === 8, 'the replay requests');
    let peak = 0;
    for (let i = 0; i < 30; i++) {
      await sleep(100);
      peak = Math.max(peak, rss(pid) - before);
    }
    console.log(`replay peers: RSS +${(peak / MiB).toFixed(1)} MiB`);
    expect(peak).toBeLessThan(8 * 8 * MiB + 48 * MiB);
  }, 60_000);

  it('a stalled live subscriber holds at most its HWM of batches, and the stream goes on', async () => {
    const node = await serve(['--hwm', '64', '--sim-rate', '2000', '--sim-blocks', '65536', '--buffer-steps', '200']);
    const pid = node.proc.pid as number;
    // Past warm-up: the engine's pool and the replay log are full, so the process stops growing by itself.
    await until(() => Number(node.status().batches ?? 0) >= 260, 'a full replay log');
    await sleep(300);
    const before = rss(pid);
    const batchesAtStart = Number(node.status().batches);
    const stalled = new Subscriber({ receiveHighWaterMark: 1, linger: 0 });
    cleanup.push(() => stalled.close());
    stalled.connect(node.serving.endpoint as string);
    stalled.subscribe();
    await until(() => Number(node.status().subscribers ?? 0) === 1, 'the subscriber');
    let peak = 0;
    for (let i = 0; i < 80; i++) {
      await sleep(100);
      peak = Math.max(peak, rss(pid) - before);
    }
    const published = Number(node.status().batches) - batchesAtStart;
    console.log(`stalled SUB: ${published} batches published, RSS +${(peak / MiB).toFixed(1)} MiB`);
    expect(published).toBeGreaterThan(4 * 64); // far more than the HWM went out meanwhile
    expect(peak).toBeLessThan(64 * 128 * 1024 + 48 * MiB);
  }, 60_000);
});
