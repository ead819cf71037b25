import { type ChildProcess, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { afterEach, describe, expect, it } from 'vitest';
import { IndexerServer, RouterIndex } from '../dist/index.mjs';
import { repoPath, sleep, until } from './fixtures.js';
import { post } from './router_fixtures.js';

// `kvplane indexer` following an SMG-proto KV-event server that is not kvplane
// (scripts/smg_kv_server.py: smg-grpc-proto's own servicer and messages over grpcio).

const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

const BS = 16;
const tokensOf = (hashes: number[]) => hashes.flatMap((h) => Array(BS).fill(h));

async function smgServer(args: string[] = []): Promise<{
  address: string;
  pid: number;
  run(cmd: Record<string, unknown>): Promise<void>;
}> {
  const proc: ChildProcess = spawn('python3', [repoPath('scripts/smg_kv_server.py'), ...args], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const exited = new Promise((r) => proc.once('exit', r));
  cleanup.push(async () => {
    proc.kill('SIGKILL');
    await exited;
  });
  const lines = createInterface({ input: proc.stdout as NodeJS.ReadableStream })[Symbol.asyncIterator]();
  const ready = JSON.parse((await lines.next()).value) as { grpc: string };
  return {
    address: ready.grpc,
    pid: proc.pid as number,
    async run(cmd) {
      proc.stdin?.write(`${JSON.stringify(cmd)}\n`);
      expect(JSON.parse((await lines.next()).value)).toEqual({ ok: true });
    },
  };
}

describe('kvplane indexer following an SMG-proto server of smg-grpc-proto', () => {
  it('applies its KvEventBatch messages per DP rank, and resumes from the last seq after a lost stream', async () => {
    const smg = await smgServer();
    await smg.run({ op: 'store', rank: 0, hashes: [1, 2, 3], parent: null });
    await smg.run({ op: 'store', rank: 1, hashes: [1], parent: null });
    const ix = await IndexerServer.create({ host: '127.0.0.1', port: 0 });
    cleanup.push(() => ix.close());
    const reg = { instance_id: 3, endpoint: `grpc://${smg.address}`, model_name: 'm', block_size: BS };
    expect((await post(ix.url, '/register', reg)).status).toBe(201);
    const index = ix.registry.index('m', 'default');
    const sub = () => index.subscription(3n)?.stats();
    await until(() => sub()?.lastSeq === 2n, 'the log applied');
    const query = { token_ids: tokensOf([1, 2, 3, 4]), model_name: 'm' };
    expect((await post(ix.url, '/query', query)).json.scores).toEqual({ '3': { '0': 3 * BS, '1': BS } });

    // Live batches, a lost stream, and what was published meanwhile.
    await smg.run({ op: 'store', rank: 0, hashes: [4], parent: 3 });
    await until(() => sub()?.lastSeq === 3n, 'the live batch');
    await smg.run({ op: 'drop' });
    await smg.run({ op: 'remove', rank: 0, hashes: [3, 4] });
    await smg.run({ op: 'store', rank: 1, hashes: [2], parent: 1 });
    await until(() => sub()?.lastSeq === 5n, 'resumed from seq 4', 15_000);
    await sleep(50);
    expect((await post(ix.url, '/query', query)).json.scores).toEqual({ '3': { '0': 2 * BS, '1': 2 * BS } });
    const s = sub();
    expect(s?.recoveries).toMatchObject({ snapshot: 1, resume: 1 });
    expect(s?.epoch).toBeNull(); // no x-kvplane-epoch from this server
    expect(s?.duplicates).toBe(0);
    // Lost again with nothing new to send: grpcio sends no headers until a message, and the
    // resumed stream still counts as live once connected.
    await smg.run({ op: 'drop' });
    await until(() => sub()?.recoveries.resume === 2 && sub()?.state === 'live', 'resumed on a quiet server', 15_000);
  }, 30_000);

  it('follows a server whose x-kvplane-epoch is not a number as one that sends none, and says so', async () => {
    const smg = await smgServer();
    await smg.run({ op: 'epoch', value: 'not-a-number' });
    await smg.run({ op: 'store', rank: 0, hashes: [1, 2], parent: null });
    const ix = new RouterIndex({ blockSize: BS });
    cleanup.push(() => ix.close());
    const warnings: string[] = [];
    ix.on('warning', (msg) => warnings.push(msg));
    ix.subscribe(5n, { kind: 'grpc', address: smg.address });
    await until(() => ix.subscription(5n)?.stats().lastSeq === 1n, 'the log applied');
    const s = ix.subscription(5n)?.stats();
    expect([s?.state, s?.epoch]).toEqual(['live', null]);
    expect(s?.lastError).toMatch(/malformed x-kvplane-epoch header ignored: "not-a-number"/);
    expect(warnings).toContain('malformed epoch header ignored');
    expect([...ix.findMatches(tokensOf([1, 2])).device]).toEqual([2]);
  }, 30_000);

  it('backs off from a server that ends every stream at once, instead of calling it in a loop', async () => {
    const smg = await smgServer();
    await smg.run({ op: 'end_at_once', on: true });
    const ix = new RouterIndex({ blockSize: BS });
    cleanup.push(() => ix.close());
    ix.subscribe(6n, { kind: 'grpc', address: smg.address });
    await sleep(3000);
    const s = ix.subscription(6n)?.stats();
    // 100, 200, 400, 800 and 1,600 ms apart (±20%): a handful, not thousands.
    expect(s?.reconnects).toBeGreaterThanOrEqual(3);
    expect(s?.reconnects).toBeLessThanOrEqual(8);
    expect(s?.lastError).toBe('stream ended');
    expect(s?.state).not.toBe('live');
    // Once the server serves again, the stream stays.
    await smg.run({ op: 'end_at_once', on: false });
    await smg.run({ op: 'store', rank: 0, hashes: [7], parent: null });
    await until(() => ix.subscription(6n)?.stats().lastSeq === 1n, 'served again', 15_000);
  }, 30_000);

  it('starts over from 0 at once when a resumed stream gets OUT_OF_RANGE, whatever the backoff had grown to', async () => {
    const smg = await smgServer(['--keep', '2']);
    await smg.run({ op: 'store', rank: 0, hashes: [1], parent: null });
    const ix = new RouterIndex({ blockSize: BS });
    cleanup.push(() => ix.close());
    ix.subscribe(10n, { kind: 'grpc', address: smg.address });
    const sub = () => ix.subscription(10n)?.stats();
    await until(() => sub()?.lastSeq === 1n, 'the log applied');
    // Streams ended at once for 2.5 s: the backoff grows past a second.
    await smg.run({ op: 'end_at_once', on: true });
    await smg.run({ op: 'drop' });
    await sleep(2500);
    // Meanwhile the log moved on past the cursor (it keeps 2 batches: 3 and 4).
    for (const h of [2, 3, 4]) await smg.run({ op: 'store', rank: 0, hashes: [h], parent: h - 1 });
    await smg.run({ op: 'end_at_once', on: false });
    let refusedAt = 0;
    await until(
      () => {
        if (refusedAt === 0 && /^OUT_OF_RANGE/.test(sub()?.lastError ?? '')) refusedAt = performance.now();
        return sub()?.lastSeq === 4n;
      },
      'the log from 0',
      15_000,
    );
    expect(refusedAt).toBeGreaterThan(0);
    expect(performance.now() - refusedAt).toBeLessThan(1000);
    expect(sub()?.recoveries.snapshot).toBe(2);
  }, 30_000);

  it('gives up a snapshot whose next chunk does not come, and starts over from 0', async () => {
    const smg = await smgServer();
    await smg.run({ op: 'store', rank: 0, hashes: [1], parent: null });
    await smg.run({ op: 'snapshot_stall', on: true });
    const ix = new RouterIndex({ blockSize: BS });
    cleanup.push(() => ix.close());
    const warnings: unknown[] = [];
    ix.on('warning', (msg, detail) => warnings.push([msg, detail.reason]));
    ix.subscribe(11n, { kind: 'grpc', address: smg.address, snapshotStallMs: 800 });
    const sub = () => ix.subscription(11n)?.stats();
    // Chunk 1 of 2 applied: half-built, and said to be.
    await until(() => sub()?.lastSeq === 1n, 'the first chunk');
    expect(sub()?.state).toBe('recovering');
    expect([...ix.findMatches(tokensOf([100])).device]).toEqual([1]);
    await until(() => /^snapshot stalled/.test(sub()?.lastError ?? ''), 'the stall given up', 5000);
    expect(warnings).toContainEqual(['rebuilding the worker from a snapshot', 'snapshot stalled: no chunk for 800 ms']);
    // A server that stalls every snapshot is asked again after the backoff, not in a loop.
    await sleep(2000);
    const stalls = sub()?.reconnects ?? 0;
    expect(stalls).toBeGreaterThanOrEqual(1);
    expect(stalls).toBeLessThanOrEqual(4);
    expect(sub()?.state).not.toBe('live');
    // Served whole again: the log from 0 replaces the half-built state.
    await smg.run({ op: 'snapshot_stall', on: false });
    await until(() => sub()?.state === 'live', 'live again', 10_000);
    expect([...ix.findMatches(tokensOf([100])).device]).toEqual([]);
    expect([...ix.findMatches(tokensOf([1])).device]).toEqual([1]);
    expect(() => ix.subscribe(12n, { kind: 'grpc', address: smg.address, snapshotStallMs: 0 })).toThrow(
      expect.objectContaining({ code: 'ERR_INVALID_ARG' }),
    );
  }, 30_000);

  it('notices a server that stops answering (keepalive pings), and follows it again once it answers', async () => {
    const smg = await smgServer();
    await smg.run({ op: 'store', rank: 0, hashes: [1], parent: null });
    const ix = new RouterIndex({ blockSize: BS });
    cleanup.push(() => ix.close());
    ix.subscribe(7n, { kind: 'grpc', address: smg.address, keepaliveMs: 500 });
    const sub = () => ix.subscription(7n)?.stats();
    await until(() => sub()?.state === 'live', 'live');
    process.kill(smg.pid, 'SIGSTOP');
    cleanup.push(() => process.kill(smg.pid, 'SIGCONT'));
    const t0 = performance.now();
    await until(() => sub()?.state !== 'live', 'the hung server noticed', 10_000);
    expect(performance.now() - t0).toBeLessThan(5000);
    process.kill(smg.pid, 'SIGCONT');
    await smg.run({ op: 'store', rank: 0, hashes: [2], parent: 1 });
    await until(() => sub()?.lastSeq === 2n && sub()?.state === 'live', 'followed again', 20_000);
    expect([...ix.findMatches(tokensOf([1, 2])).device]).toEqual([2]);
  }, 40_000);

  it('refuses a message over maxMessageBytes without reading it whole, and says why', async () => {
    const smg = await smgServer();
    await smg.run({ op: 'store', rank: 0, hashes: Array.from({ length: 2000 }, (_, i) => i + 1), parent: null });
    const ix = new RouterIndex({ blockSize: BS });
    cleanup.push(() => ix.close());
    ix.subscribe(8n, { kind: 'grpc', address: smg.address, maxMessageBytes: 64 * 1024 });
    await until(() => /RESOURCE_EXHAUSTED/.test(ix.subscription(8n)?.stats().lastError ?? ''), 'the refusal');
    expect(ix.subscription(8n)?.stats().lastSeq).toBeNull();
    expect(() => ix.subscribe(9n, { kind: 'grpc', address: smg.address, keepaliveMs: 0 })).toThrow(
      expect.objectContaining({ code: 'ERR_INVALID_ARG' }),
    );
  }, 30_000);
});
