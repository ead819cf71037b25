import { type ChildProcess, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { afterEach, describe, expect, it } from 'vitest';
import { IndexerServer } from '../dist/index.mjs';
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

async function smgServer(): Promise<{ address: string; run(cmd: Record<string, unknown>): Promise<void> }> {
  const proc: ChildProcess = spawn('python3', [repoPath('scripts/smg_kv_server.py')], {
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
  }, 30_000);
});
