import { describe, expect, it } from 'vitest';
import { KvEventStream, KvPlaneError, SimSource, SOURCES, sourceNames } from '../src/index.js';
import { createSource } from '../src/sources/registry.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('source registry', () => {
  it('knows the simulated engine and refuses unknown names, listing the known ones', () => {
    expect(sourceNames()).toContain('sim');
    expect(SOURCES.sim?.help).toMatch(/simulated/);
    const src = createSource('sim', { blockSize: 16, sim: { seed: 3 } });
    expect(src).toBeInstanceOf(SimSource);
    expect(src.name).toBe('sim');
    let err: unknown;
    try {
      createSource('vllm-typo', { sim: {} });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(KvPlaneError);
    expect(err).toMatchObject({ code: 'ERR_INVALID_ARG' });
    expect((err as Error).message).toMatch(/unknown engine; known: sim/);
  });
});

describe('SimSource', () => {
  it('starts into a stream, reports stats and health, and stops delivering on stop()', async () => {
    const stream = new KvEventStream({ blockSize: 16 });
    const src = new SimSource({ seed: 5, numBlocks: 256, requestsPerSecond: 400, stepMs: 5 });
    expect(src.health()).toEqual({ state: 'stopped', reason: 'not started' });
    await src.start(stream);
    expect(src.health()).toEqual({ state: 'ok' });
    await expect(src.start(stream)).rejects.toMatchObject({ code: 'ERR_INVALID_ARG' });
    const until = Date.now() + 5000;
    while (stream.stats().events === 0 && Date.now() < until) await sleep(20);
    await src.stop();
    expect(src.health()).toEqual({ state: 'stopped', reason: 'stopped' });
    await stream.flush();
    const after = stream.stats().events;
    expect(after).toBeGreaterThan(0);
    const stats = src.stats();
    expect(stats.steps).toBeGreaterThan(0);
    // Every event the source emitted reached the index: it holds exactly the engine's cached blocks.
    expect(stream.indexer.stats().blocks).toBe(stats.cachedBlocks);
    expect(stream.indexer.stats().drops.unknown_parent).toBe(0);
    await sleep(50);
    await stream.flush();
    expect(stream.stats().events).toBe(after);
    await stream.close();
  });
});

describe('EngineZmqSource', () => {
  it('refuses to start once stopped, rather than starting to nothing', async () => {
    const src = createSource('vllm', { sim: {}, engine: { endpoint: 'tcp://127.0.0.1:9' } });
    await src.stop();
    const stream = new KvEventStream({ blockSize: 16 });
    await expect(src.start(stream)).rejects.toMatchObject({
      code: 'ERR_INVALID_ARG',
      message: 'the vllm source is stopped',
    });
    await stream.close();
  });
});
