import { createServer } from 'node:net';
import { Counter, Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import {
  decodeBatch,
  hashBlocksAsync,
  IndexerServer,
  KvEventPublisher,
  KvEventStream,
  KvGrpcServer,
  KvHttpServer,
  KvPlaneError,
  RouterIndex,
} from '../src/index.js';
import { FROM_SEQ_1 } from './fixtures.js';

const BS = 4;

function stored(first: number) {
  return {
    blockHashes: [BigInt(first)],
    parentBlockHash: null,
    tokenIds: Uint32Array.from({ length: BS }, (_, i) => first * 100 + i),
    blockSize: BS,
  };
}

describe('stream.batches(): for await over the published batches', () => {
  it('yields every batch in seq order, decodable, until the signal aborts', async () => {
    const s = new KvEventStream({ blockSize: BS, ...FROM_SEQ_1 });
    const ac = new AbortController();
    const seen: bigint[] = [];
    const hashes: bigint[] = [];
    const loop = (async () => {
      for await (const { seqs, payloads } of s.batches({ signal: ac.signal })) {
        seqs.forEach((seq, i) => {
          seen.push(seq);
          for (const e of decodeBatch(payloads[i] as Buffer, 'vllm').events) {
            if (e.type === 'stored') hashes.push(...(e.blockHashes ?? []));
          }
        });
        if (seen.length >= 5) ac.abort();
      }
    })();
    for (let i = 1; i <= 5; i++) {
      s.stored(stored(i));
      await s.flush();
    }
    await loop;
    expect(seen).toEqual([1n, 2n, 3n, 4n, 5n]);
    expect(hashes).toEqual([1n, 2n, 3n, 4n, 5n]);
    await s.close();
  });

  it('ends on break (its consumer removed) and when the stream closes', async () => {
    const s = new KvEventStream({ blockSize: BS, ...FROM_SEQ_1 });
    const it1 = s.batches();
    const first = it1.next();
    s.stored(stored(1));
    await s.flush();
    expect((await first).value?.seqs).toEqual(new BigUint64Array([1n]));
    const it2 = s.batches({ format: 'smg_proto' });
    const loop = (async () => {
      let n = 0;
      for await (const _ of it2) {
        n++;
        break;
      }
      return n;
    })();
    s.stored(stored(2));
    await s.flush();
    expect(await loop).toBe(1);
    expect(await it2.next()).toEqual({ value: undefined, done: true });
    expect((await it1.next()).value?.seqs).toEqual(new BigUint64Array([2n]));
    const pending = it1.next();
    await s.close();
    expect(await pending).toEqual({ value: undefined, done: true });
  });

  it('a loop that falls behind loses the oldest drains, counted, and sees the gap in the seqs', async () => {
    const s = new KvEventStream({ blockSize: BS, ...FROM_SEQ_1 });
    const it = s.batches({ maxQueued: 2 });
    for (let i = 1; i <= 5; i++) {
      s.stored(stored(i));
      await s.flush();
    }
    expect(it.dropped).toBe(3);
    const a = await it.next();
    const b = await it.next();
    expect([a.value?.seqs[0], b.value?.seqs[0]]).toEqual([4n, 5n]);
    await it.return?.();
    expect(() => s.batches({ maxQueued: 0 })).toThrow(KvPlaneError);
    await s.close();
  });

  it('an already aborted signal yields nothing', async () => {
    const s = new KvEventStream({ blockSize: BS, ...FROM_SEQ_1 });
    const it = s.batches({ signal: AbortSignal.abort() });
    s.stored(stored(1));
    await s.flush();
    expect(await it.next()).toEqual({ value: undefined, done: true });
    await s.close();
  });
});

describe("metrics into the application's registry", () => {
  it('KvHttpServer registers its metrics, prefixed, into a registry it is given', async () => {
    const registry = new Registry();
    const mine = new Counter({ name: 'app_requests_total', help: 'the app', registers: [registry] });
    mine.inc(3);
    const pub = await KvEventPublisher.create({ endpoint: 'tcp://127.0.0.1:*', replayEndpoint: null, blockSize: BS });
    const http = await KvHttpServer.create({
      publisher: pub,
      host: '127.0.0.1',
      metrics: { registry, prefix: 'node_a_' },
    });
    try {
      pub.stored(stored(1));
      await pub.flush();
      const text = await registry.metrics();
      expect(text).toContain('app_requests_total 3');
      expect(text).toMatch(/^node_a_kvplane_events_published_total [1-9]\d*$/m);
      expect(text).not.toMatch(/^kvplane_/m);
      for (const name of ['replay_malformed_total', 'zmq_live_peers_refused_total', 'zmq_live_accept_errors_total'])
        expect(text).toMatch(new RegExp(`^node_a_kvplane_${name} 0$`, 'm'));
      // The server's own /metrics serves the same registry.
      const served = await (await fetch(`${http.url}/metrics`)).text();
      expect(served).toContain('app_requests_total 3');
      expect(served).toMatch(/^node_a_kvplane_events_published_total [1-9]\d*$/m);
    } finally {
      await http.close();
      await pub.close();
    }
  });
  it('IndexerServer registers its metrics, per-worker families too, prefixed, into a registry it is given, and emits recovered', async () => {
    const registry = new Registry();
    const pub = await KvEventPublisher.create({ endpoint: 'tcp://127.0.0.1:*', replayEndpoint: null, blockSize: BS });
    const ix = await IndexerServer.create({
      host: '127.0.0.1',
      port: 0,
      workers: [{ instanceId: 7n, dpRank: 0, modelName: 'm', routingGroup: '', blockSize: BS, endpoint: pub.endpoint }],
      metrics: { registry, prefix: 'router_' },
    });
    const recovered: Array<{ modelName: string; routingGroup: string; workerId: bigint; kind: string }> = [];
    ix.on('recovered', (e) => recovered.push(e));
    try {
      // The worker's last seq appears once the subscription has applied the published batch.
      let text = '';
      for (let i = 0; i < 100 && !/^router_kvplane_indexer_worker_events_total\{[^}]*\} [1-9]/m.test(text); i++) {
        pub.stored(stored(i + 1));
        await pub.flush();
        await new Promise((r) => setTimeout(r, 50));
        text = await registry.metrics();
      }
      expect(text).toMatch(/^router_kvplane_indexer_worker_events_total\{instance_id="7",dp_rank="0"\} [1-9]\d*$/m);
      expect(text).toMatch(/^router_kvplane_indexer_worker_last_seq\{instance_id="7",dp_rank="0"\} \d+$/m);
      expect(text).toMatch(/^router_kvplane_indexer_workers 1$/m);
      expect(text).not.toMatch(/^kvplane_/m);
      // The worker joined a stream already running, without replay: the server tells that its
      // state was cleared (nothing to rebuild from), naming the index.
      expect(recovered).toContainEqual(
        expect.objectContaining({ modelName: 'm', routingGroup: '', workerId: 7n, dpRank: 0, kind: 'cleared' }),
      );
      // The server's own /metrics serves the same registry, each family once.
      const served = await (await fetch(`${ix.url}/metrics`)).text();
      expect(served.match(/^# TYPE router_kvplane_indexer_worker_events_total /gm)).toHaveLength(1);
      expect(served).toMatch(
        /^router_kvplane_indexer_requests_total\{endpoint="\/metrics"\}|^router_kvplane_indexer_models 1$/m,
      );
    } finally {
      await ix.close();
      await pub.close();
    }
  });
});

describe("the indexer's own /metrics", () => {
  it("writes a worker's last seq exactly, past 2^53", async () => {
    const first = 2n ** 60n + 7n;
    const pub = await KvEventPublisher.create({
      endpoint: 'tcp://127.0.0.1:*',
      replayEndpoint: null,
      blockSize: BS,
      firstSeq: first,
    });
    const ix = await IndexerServer.create({
      host: '127.0.0.1',
      port: 0,
      workers: [{ instanceId: 7n, dpRank: 0, modelName: 'm', routingGroup: '', blockSize: BS, endpoint: pub.endpoint }],
    });
    try {
      let text = '';
      for (let i = 0; i < 100 && !/_worker_last_seq\{/.test(text); i++) {
        pub.stored(stored(i + 1));
        await pub.flush();
        await new Promise((r) => setTimeout(r, 50));
        text = await (await fetch(`${ix.url}/metrics`)).text();
      }
      const seq = /^kvplane_indexer_worker_last_seq\{instance_id="7",dp_rank="0"\} (\d+)$/m.exec(text)?.[1];
      expect(BigInt(seq ?? '0')).toBe(ix.registry.index('m', '').subscription(7n)?.stats().lastSeq);
      expect(BigInt(seq ?? '0') > first).toBe(true);
    } finally {
      await ix.close();
      await pub.close();
    }
  });
});

describe('AbortSignal on async calls', () => {
  const isAbort = (e: unknown) => e instanceof Error && e.name === 'AbortError';

  it('hashBlocksAsync, dumpTree, recover and flush reject with the abort reason', async () => {
    const tokens = Uint32Array.from({ length: 1 << 16 }, (_, i) => i);
    await expect(hashBlocksAsync(tokens, { blockSize: 16, signal: AbortSignal.abort() })).rejects.toSatisfy(isAbort);
    // Aborted while the hashing runs off the JS thread.
    const ac = new AbortController();
    const running = hashBlocksAsync(tokens, { blockSize: 16, signal: ac.signal });
    ac.abort();
    await expect(running).rejects.toSatisfy(isAbort);
    // Not aborted: the result as usual.
    const done = await hashBlocksAsync(tokens, { blockSize: 16, signal: new AbortController().signal });
    expect(done.hashes.length).toBe(4096);

    const pub = await KvEventPublisher.create({ endpoint: 'tcp://127.0.0.1:*', replayEndpoint: null, blockSize: BS });
    try {
      pub.stored(stored(1));
      await expect(pub.flush({ signal: AbortSignal.abort() })).rejects.toSatisfy(isAbort);
      await pub.flush({ signal: new AbortController().signal });
      await expect(pub.indexer.dumpTree({ signal: AbortSignal.abort() })).rejects.toSatisfy(isAbort);
      expect((await pub.indexer.dumpTree({})).workers.length).toBe(1);
      await expect(
        pub.indexer.recoverQuery(undefined, undefined, 'json', { signal: AbortSignal.abort() }),
      ).rejects.toSatisfy(isAbort);
      expect((await pub.indexer.recoverQuery(undefined, undefined, 'json', {})).kind).toBe('TreeDump');
      await expect(pub.indexer.recover(0n, undefined, 'json', { signal: AbortSignal.abort() })).rejects.toSatisfy(
        isAbort,
      );
    } finally {
      await pub.close();
    }
  });

  it('KvEventPublisher.create with an aborted signal opens nothing', async () => {
    const freePort = async () => {
      const probe = createServer();
      await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
      const port = (probe.address() as { port: number }).port;
      await new Promise<void>((resolve) => probe.close(() => resolve()));
      return port;
    };
    const endpoint = `bind:tcp://127.0.0.1:${await freePort()}`;
    await expect(
      KvEventPublisher.create({ endpoint, replayEndpoint: null, signal: AbortSignal.abort() }),
    ).rejects.toSatisfy(isAbort);
    // The port is free: the aborted call bound nothing.
    const pub = await KvEventPublisher.create({ endpoint, replayEndpoint: null });
    try {
      const port = await freePort();
      const signal = AbortSignal.abort();
      await expect(KvHttpServer.create({ publisher: pub, host: '127.0.0.1', port, signal })).rejects.toSatisfy(isAbort);
      await expect(KvGrpcServer.create({ stream: null, host: '127.0.0.1', port, signal })).rejects.toSatisfy(isAbort);
      await expect(IndexerServer.create({ host: '127.0.0.1', port, signal })).rejects.toSatisfy(isAbort);
      // Not aborted, the same port binds.
      const http = await KvHttpServer.create({
        publisher: pub,
        host: '127.0.0.1',
        port,
        signal: new AbortController().signal,
      });
      await http.close();
    } finally {
      await pub.close();
    }
  });
});

describe('AbortSignal on close and unsubscribe', () => {
  const isAbort = (e: unknown) => e instanceof Error && e.name === 'AbortError';

  it('an aborted wait rejects with its reason and the close or unsubscribe still completes', async () => {
    const pub = await KvEventPublisher.create({ endpoint: 'tcp://127.0.0.1:*', replayEndpoint: null, blockSize: BS });
    const index = new RouterIndex({ blockSize: BS });
    const sub = index.subscribe(7n, { kind: 'zmq', endpoint: pub.endpoint });
    for (let i = 0; i < 100 && sub.stats().events === 0; i++) {
      pub.stored(stored(i + 1));
      await pub.flush();
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(index.dump(7n).length).toBeGreaterThan(0);
    await expect(index.unsubscribe(7n, undefined, { signal: AbortSignal.abort() })).rejects.toSatisfy(isAbort);
    // Given up on, the unsubscribe still stops the subscription and drops the worker's blocks.
    for (let i = 0; i < 100 && index.dump(7n).length > 0; i++) await new Promise((r) => setTimeout(r, 10));
    expect(index.dump(7n)).toEqual([]);
    expect(index.subscription(7n)).toBeUndefined();
    await expect(index.close({ signal: AbortSignal.abort() })).rejects.toSatisfy(isAbort);
    expect(() => index.dump()).toThrow(KvPlaneError);

    const grpc = await KvGrpcServer.create({ stream: pub.stream, host: '127.0.0.1', port: 0 });
    const http = await KvHttpServer.create({ publisher: pub, host: '127.0.0.1' });
    const ix = await IndexerServer.create({ host: '127.0.0.1', port: 0 });
    const urls = [http.url, ix.url];
    // An aborted gRPC close shuts down at once instead of waiting for calls in flight.
    await expect(grpc.close({ signal: AbortSignal.abort() })).rejects.toSatisfy(isAbort);
    await expect(http.close({ signal: AbortSignal.abort() })).rejects.toSatisfy(isAbort);
    await expect(ix.close({ signal: AbortSignal.abort() })).rejects.toSatisfy(isAbort);
    await expect(pub.close({ signal: AbortSignal.abort() })).rejects.toSatisfy(isAbort);
    // Everything closed anyway: the publisher, and the servers stopped listening.
    for (let i = 0; i < 100 && !pub.closed; i++) await new Promise((r) => setTimeout(r, 10));
    expect(pub.closed).toBe(true);
    for (const url of urls) await expect(fetch(`${url}/health`)).rejects.toThrow();
    // Closes called together are one close: the hooks run once, and every call waits for it.
    const s = new KvEventStream({ blockSize: BS, ...FROM_SEQ_1 });
    let hooks = 0;
    s.onClose(async () => {
      await new Promise((r) => setTimeout(r, 20));
      hooks++;
    });
    s.stored(stored(1));
    await Promise.all([s.close(), s.close(), s.close({ signal: new AbortController().signal })]);
    expect(hooks).toBe(1);
    expect(s.closed).toBe(true);
    // Not aborted: closes resolve as before.
    const again = await KvEventPublisher.create({ endpoint: 'tcp://127.0.0.1:*', replayEndpoint: null, blockSize: BS });
    await again.close({ signal: new AbortController().signal });
    expect(again.closed).toBe(true);
  });
});

describe('typed events on the stream and the publisher', () => {
  it('drop when the queue is full, gap when its seq is skipped, failClosed for a rank cleared', async () => {
    const s = new KvEventStream({ blockSize: BS, maxQueueSize: 4, dataParallelRank: 3, ...FROM_SEQ_1 });
    const drops: number[] = [];
    const gaps: Array<{ seq: bigint; count: number }> = [];
    const closed: Array<{ dpRank: number; message: string }> = [];
    s.on('drop', (d) => drops.push(d.events));
    s.on('gap', (g) => gaps.push(g));
    s.on('failClosed', (f) => closed.push(f));
    s.stored(stored(1));
    await s.flush();
    const accepted = s.publish(Array.from({ length: 10 }, (_, i) => ({ type: 'stored' as const, ...stored(10 + i) })));
    expect(accepted).toBe(4);
    expect(drops).toEqual([6]);
    await s.flush();
    s.cleared();
    await s.flush();
    expect(gaps.reduce((n, g) => n + g.count, 0)).toBe(s.stats().gaps);
    expect(gaps.length).toBeGreaterThan(0);
    // Three tokens for one block of four: the layout fails closed and the rank goes out cleared.
    s.stored({ blockHashes: [99n], parentBlockHash: null, tokenIds: new Uint32Array([1, 2, 3]), blockSize: BS });
    await s.flush();
    expect(closed).toHaveLength(1);
    expect(closed[0]?.dpRank).toBe(3);
    expect(closed[0]?.message).toMatch(/layout|tokens/i);
    await s.close();
  });

  it('a publisher forwards its stream events', async () => {
    const pub = await KvEventPublisher.create({
      endpoint: 'tcp://127.0.0.1:*',
      replayEndpoint: null,
      blockSize: BS,
      maxQueueSize: 2,
    });
    try {
      let dropped = 0;
      const onDrop = (d: { events: number }) => {
        dropped += d.events;
      };
      pub.on('drop', onDrop);
      pub.publish(Array.from({ length: 5 }, (_, i) => ({ type: 'stored' as const, ...stored(i + 1) })));
      expect(dropped).toBe(3);
      pub.off('drop', onDrop);
      await pub.flush();
      pub.publish(Array.from({ length: 5 }, (_, i) => ({ type: 'stored' as const, ...stored(i + 10) })));
      expect(dropped).toBe(3);
    } finally {
      await pub.close();
    }
  });
});
