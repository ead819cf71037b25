import { afterEach, describe, expect, it } from 'vitest';
import { type Engine, type EnginePeer, enginePeer, restartEnginePeer } from './engine_peer.js';
import { engineRanks, relayed, runGrpcPeer, type ServeNode, serveNode, sleep } from './fixtures.js';

// The engines' own publishers (scripts/engine_peer.py: vLLM's and SGLang's ZmqEventPublisher and
// event structs from their wheels) relayed by `kvplane serve --engine vllm|sglang`.

const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

const range = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);

async function relay(engine: Engine, peer: EnginePeer, ...extra: string[]): Promise<{ node: ServeNode; http: string }> {
  const args = ['--engine', engine, '--engine-endpoint', peer.endpoint, '--http-port', '0', ...extra];
  args.push('--engine-replay-endpoint', peer.replay ?? 'none');
  const node = await serveNode(args, cleanup);
  const http = node.serving.http as string;
  // Until every rank's SUB is connected: what the engine publishes before is not relayed live.
  for (let i = 0; i < 100; i++) {
    const ranks = await engineRanks(http);
    if (ranks.length > 0 && ranks.every((r) => r.connected === true)) break;
    await sleep(50);
  }
  await sleep(200); // the subscription reaching the engine's PUB
  return { node, http };
}

interface Dump {
  TreeDump: { workers: Array<{ dp_rank: number; events: Array<{ block_hashes: number[] }> }> };
}

/** The relay's tree, as block hashes by rank. */
async function blocksByRank(http: string): Promise<Record<number, number[]>> {
  const d = (await (await fetch(`${http}/kv_recover`)).json()) as Dump;
  const out: Record<number, number[]> = {};
  for (const w of d.TreeDump.workers) {
    out[w.dp_rank] = w.events.flatMap((e) => e.block_hashes).sort((a, b) => a - b);
  }
  return out;
}

/** Polls the relay's tree until it equals `want` (or 10 s pass), and returns the last one seen. */
async function treeReaches(http: string, want: Record<number, number[]>): Promise<Record<number, number[]>> {
  let got: Record<number, number[]> = {};
  const deadline = Date.now() + 10_000;
  while (Date.now() < deadline) {
    got = await blocksByRank(http);
    if (JSON.stringify(got) === JSON.stringify(want)) break;
    await sleep(100);
  }
  return got;
}

describe.each<Engine>(['vllm', 'sglang'])('kvplane serve --engine %s relays the engine’s own publisher', (engine) => {
  it('joins late from the replay on two DP ranks, relays live batches, and rebuilds after a restart', async () => {
    const peer = await enginePeer(cleanup, engine, '--dp-size', '2');
    // Before the relay exists: seqs 0..2 on rank 0, 0..1 on rank 1.
    await peer.run({ op: 'store', rank: 0, hashes: range(1, 6), parent: null, per_batch: 2 });
    await peer.run({ op: 'store', rank: 1, hashes: range(101, 4), parent: null, per_batch: 2 });
    await peer.run({ op: 'sync' });
    const { http } = await relay(engine, peer, '--engine-dp-size', '2');
    // Live: the first live batch on each rank shows the relay is behind; the rest comes from replay.
    await peer.run({ op: 'store', rank: 0, hashes: range(7, 2), parent: 6 });
    await peer.run({ op: 'store', rank: 1, hashes: range(105, 2), parent: 104 });
    await peer.run({ op: 'remove', rank: 0, hashes: [8] });
    await peer.run({ op: 'sync' });
    const want = { 0: range(1, 7), 1: range(101, 6) };
    expect(await treeReaches(http, want)).toEqual(want);
    const ranks = await engineRanks(http);
    // Nothing was unrecoverable: the engine's replay held everything from its seq 0.
    expect(ranks.map((r) => [r.rank, r.lastEngineSeq, r.unrecoverable, r.restarts])).toEqual([
      [0, 4, 0, 0],
      [1, 2, 0, 0],
    ]);
    // Each batch under its rank in the relay's own stream, and no clear beyond the one at start.
    const out = await relayed(http);
    // The node opens with a clear of everything, then each rank is cleared as its relay starts.
    const clears = out.filter((b) => b.events.some((e) => e.type === 'AllBlocksCleared'));
    expect(clears.map((b) => b.dp_rank)).toEqual([null, 0, 1]);
    expect(out.filter((b) => b.dp_rank === 0).flatMap((b) => b.events.map((e) => e.type))).toEqual([
      'AllBlocksCleared',
      ...Array(4).fill('BlockStored'),
      'BlockRemoved',
    ]);

    // The engine restarts on the same ports, numbering from 0 again, without the old blocks.
    const again = await restartEnginePeer(cleanup, engine, peer, ['--dp-size', '2']);
    await sleep(500); // the relay's SUBs reconnecting
    await again.run({ op: 'store', rank: 0, hashes: [500, 501], parent: null, per_batch: 1 });
    await again.run({ op: 'store', rank: 1, hashes: [600], parent: null });
    await again.run({ op: 'sync' });
    const fresh = { 0: [500, 501], 1: [600] };
    expect(await treeReaches(http, fresh)).toEqual(fresh);
    const after = await engineRanks(http);
    expect(after.map((r) => [r.rank, r.restarts])).toEqual([
      [0, 1],
      [1, 1],
    ]);
  }, 60_000);

  it('fills the gaps of a burst from the engine’s replay, each batch applied once', async () => {
    // Small send and receive HWMs on both ends: a 2,000-batch burst (one root block each)
    // overflows them.
    const peer = await enginePeer(cleanup, engine, '--hwm', '2');
    const { http } = await relay(engine, peer, '--engine-hwm', '2');
    await peer.run({ op: 'store', hashes: range(1, 2000), parent: null, per_batch: 1, chain: false });
    await peer.run({ op: 'sync' });
    // The burst's last batches may be dropped too, and nothing shows it until the engine's next
    // batch (vLLM's stream has no heartbeat): one more, once the burst has drained.
    await sleep(500);
    await peer.run({ op: 'store', hashes: [2001], parent: null });
    await peer.run({ op: 'sync' });
    // Until the relay is at the engine's last seq with no fetch in progress and its tree is still.
    let rank: Record<string, unknown> = {};
    let got: Record<number, number[]> = {};
    for (let i = 0, last = ''; i < 300; i++) {
      [rank = {}] = await engineRanks(http);
      got = await blocksByRank(http);
      const now = JSON.stringify([rank, got[0]?.length]);
      if (rank.lastEngineSeq === 2000 && rank.fetching === false && now === last) break;
      last = now;
      await sleep(100);
    }
    console.log(`${engine} burst into HWM 2: ${JSON.stringify(rank)}`);
    expect(rank).toMatchObject({ lastEngineSeq: 2000, restarts: 0, heldDropped: 0 });
    if (engine === 'vllm' || rank.unrecoverable === 0) {
      // vLLM's replay ROUTER holds its whole buffer (HWM 2 x (buffer_steps + 1)): every gap fills.
      expect(rank).toMatchObject({ applied: 2001, unrecoverable: 0 });
      expect(got).toEqual({ 0: range(1, 2001) });
    } else {
      // SGLang's replay ROUTER keeps ZMQ's default HWM (1,000 messages) and drops the rest of a
      // longer replay: the relay sees the hole, clears the rank and holds what follows it.
      expect(rank.cleared as number).toBeGreaterThanOrEqual(1);
      const held = got[0] ?? [];
      expect(held).toEqual(range(2002 - held.length, held.length));
    }
  }, 60_000);

  it('without a replay socket, a relay that joins late clears the rank, counts it, and rebuilds from what follows', async () => {
    const peer = await enginePeer(cleanup, engine, '--no-replay');
    await peer.run({ op: 'store', hashes: range(1, 3), parent: null, per_batch: 1 }); // seqs 0..2
    await peer.run({ op: 'sync' });
    const { http, node } = await relay(engine, peer, '--grpc-host', '127.0.0.1', '--grpc-port', '0');
    // Seqs 3, 4: a new chain (a block whose parent the relay never saw would not be indexed).
    await peer.run({ op: 'store', hashes: [4, 5], parent: null, per_batch: 1 });
    await peer.run({ op: 'sync' });
    // Blocks 1..3 are lost (the engine cannot replay them): the relay holds what it saw, 4 and 5,
    // and says so: the rank counted unrecoverable, a clear in its stream before block 4.
    expect(await treeReaches(http, { 0: [4, 5] })).toEqual({ 0: [4, 5] });
    const [rank] = await engineRanks(http);
    expect(rank).toMatchObject({ lastEngineSeq: 4, unrecoverable: 1, cleared: 1, applied: 2 });
    // Per event, with its batch's rank (engine batches that arrive together go on as one).
    const types = (await relayed(http)).flatMap((b) =>
      b.events.map((e) => [b.dp_rank, `${e.type}${e.block_hashes ?? ''}`]),
    );
    expect(types).toEqual([
      [null, 'AllBlocksCleared'],
      [0, 'AllBlocksCleared'], // as the relay starts
      [0, 'AllBlocksCleared'], // the loss of seqs 0..2
      [0, 'BlockStored4'],
      [0, 'BlockStored5'],
    ]);
    // A gateway subscribing from 0 gets the rank's state marked partial: 3 engine batches unseen.
    const snap = (await runGrpcPeer([`127.0.0.1:${node.serving.grpc_port}`, 'vllm', '0', '1'])).slice(1);
    expect(snap[0]).toMatchObject({ dp_rank: 0, snapshot: { unknown_before: 3 } });
    const metrics = await (await fetch(`${http}/metrics`)).text();
    expect(metrics).toMatch(
      new RegExp(`^kvplane_engine_rank_total\\{source="${engine}",rank="0",what="unrecoverable"\\} 1$`, 'm'),
    );
    expect(node.lines.filter((l) => l.level === 'warn').map((l) => [l.msg, l.reason])).toEqual([
      ['rank cleared', 'gap'],
    ]);
  }, 30_000);
});
