import { afterEach, describe, expect, it } from 'vitest';
import { IndexerServer } from '../dist/index.mjs';
import { type Engine, enginePeer, restartEnginePeer } from './engine_peer.js';
import { sleep, until } from './fixtures.js';
import { post } from './router_fixtures.js';

// `kvplane indexer` following the engines' own publishers (scripts/engine_peer.py: vLLM's and
// SGLang's ZmqEventPublisher from their wheels), one registration per DP rank as Dynamo's indexer
// takes them.

const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

const BS = 16;
/** engine_peer.py's blocks: 16 tokens, all equal to the block's hash. */
const tokensOf = (hashes: number[]) => hashes.flatMap((h) => Array(BS).fill(h));
const rankPort = (endpoint: string, rank: number) => endpoint.replace(/:(\d+)$/, (_m, p) => `:${Number(p) + rank}`);

describe.each(['vllm', 'sglang'] as Engine[])('kvplane indexer following %s’s own publisher', (engine) => {
  it('joins late through the replay socket, scores each DP rank, and rebuilds a rank after an engine restart', async () => {
    const peer = await enginePeer(cleanup, engine, '--dp-size', '2');
    // Published before the indexer joins: fetched from the engine's replay from seq 0.
    await peer.run({ op: 'store', rank: 0, hashes: [1, 2, 3, 4], parent: null, per_batch: 1 });
    await peer.run({ op: 'store', rank: 1, hashes: [1, 2], parent: null });
    await peer.run({ op: 'sync' });
    const ix = await IndexerServer.create({ host: '127.0.0.1', port: 0 });
    cleanup.push(() => ix.close());
    for (const rank of [0, 1]) {
      const res = await post(ix.url, '/register', {
        instance_id: 5,
        dp_rank: rank,
        endpoint: rankPort(peer.endpoint, rank),
        replay_endpoint: rankPort(peer.replay as string, rank),
        model_name: 'm',
        block_size: BS,
        engine,
      });
      expect(res.status).toBe(201);
    }
    const index = ix.registry.index('m', 'default');
    await until(() => [0, 1].every((r) => index.subscription(5n, r)?.stats().state === 'live'), 'both ranks connected');
    await sleep(300);
    // Live: the rank-0 chain grows; the first live batch shows the indexer what it missed.
    await peer.run({ op: 'store', rank: 0, hashes: [5, 6], parent: 4, per_batch: 1 });
    await peer.run({ op: 'sync' });
    const query = { token_ids: [...tokensOf([1, 2, 3, 4, 5, 6]), 7, 7], model_name: 'm' };
    await until(
      () => index.findMatches(tokensOf([1, 2, 3, 4, 5, 6])).device[0] === 6 || false,
      'rank 0 at 6 blocks',
      10_000,
    ).catch(() => {});
    expect((await post(ix.url, '/query', query)).json.scores).toEqual({ '5': { '0': 6 * BS, '1': 2 * BS } });
    expect(index.subscription(5n, 0)?.stats().recoveries).toMatchObject({ cleared: 0 });

    // The engine restarts on the same ports: its seqs start at 0 again and its cache is empty.
    const again = await restartEnginePeer(cleanup, engine, peer, ['--dp-size', '2'], () =>
      until(
        () => [0, 1].every((r) => index.subscription(5n, r)?.stats().state !== 'live'),
        'both ranks disconnected',
        10_000,
      ),
    );
    // A real engine binds its sockets long before it serves (model loading): the indexer has
    // reconnected by the time the first new batch comes.
    await until(
      () => [0, 1].every((r) => index.subscription(5n, r)?.stats().state === 'live'),
      'both ranks reconnected',
      10_000,
    );
    await sleep(200);
    await again.run({ op: 'store', rank: 0, hashes: [1, 9], parent: null, per_batch: 1 });
    await again.run({ op: 'store', rank: 1, hashes: [1], parent: null });
    await again.run({ op: 'sync' });
    const want = { '5': { '0': 1 * BS, '1': 1 * BS } };
    for (let i = 0; i < 100; i++) {
      if (JSON.stringify((await post(ix.url, '/query', query)).json.scores) === JSON.stringify(want)) break;
      await sleep(50);
    }
    expect((await post(ix.url, '/query', query)).json.scores).toEqual(want);
    expect((await post(ix.url, '/query', { token_ids: tokensOf([1, 9]), model_name: 'm' })).json.scores).toEqual({
      '5': { '0': 2 * BS, '1': 1 * BS },
    });
    expect(index.subscription(5n, 0)?.stats().restarts).toBe(1);
    expect(index.subscription(5n, 1)?.stats().restarts).toBe(1);
  }, 60_000);

  it('sees an engine that restarted while idle (no live batch shows it): the old incarnation’s blocks go', async () => {
    const peer = await enginePeer(cleanup, engine);
    await peer.run({ op: 'store', rank: 0, hashes: [1, 2, 3], parent: null, per_batch: 1 });
    await peer.run({ op: 'sync' });
    const ix = await IndexerServer.create({ host: '127.0.0.1', port: 0 });
    cleanup.push(() => ix.close());
    const reg = {
      instance_id: 7,
      endpoint: peer.endpoint,
      replay_endpoint: peer.replay,
      model_name: 'm',
      block_size: BS,
      engine,
    };
    expect((await post(ix.url, '/register', reg)).status).toBe(201);
    const index = ix.registry.index('m', 'default');
    const held = () => index.findMatches(tokensOf([1, 2, 3])).device[0] ?? 0;
    await until(() => held() === 3, 'the three blocks, from the replay');
    // Down and up again on the same ports, with an empty cache, publishing nothing: before, the
    // router kept the three blocks for good (only a live batch showed it a restart).
    const again = await restartEnginePeer(cleanup, engine, peer, [], () =>
      until(() => index.subscription(7n, 0)?.stats().state !== 'live', 'disconnected', 10_000),
    );
    await until(() => held() === 0, 'the old blocks dropped', 10_000);
    expect(index.subscription(7n, 0)?.stats().restarts).toBe(1);
    // The new incarnation is followed from its first batch.
    await again.run({ op: 'store', rank: 0, hashes: [1, 9], parent: null, per_batch: 1 });
    await again.run({ op: 'sync' });
    await until(() => index.findMatches(tokensOf([1, 9])).device[0] === 2, 'the new blocks', 10_000);
  }, 60_000);
});
