import { execFile, spawnSync } from 'node:child_process';
import { createServer, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterEach, describe, expect, it } from 'vitest';
import { Publisher, Router } from 'zeromq';
import { encodeBatch, type KvEvent, RouterIndex } from '../dist/index.mjs';
import { freePort, repoPath, sleep, storedBlock, until } from './fixtures.js';

// A router's ZMQ subscriptions read their publishers with a native link (crates/kvplane-zmq:
// ZMTP 3.0 in Rust, in-order batches applied on its own thread) unless `zmqReceive: 'js'`. The
// publishers here are libzmq's (zeromq.js); vLLM's and SGLang's own (pyzmq) are followed the same
// way in router_engines.test.ts.

const execFileP = promisify(execFile);
const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

const W = 7n;
const tokensOf = (hashes: number[]) => new Uint32Array(hashes.flatMap((h) => Array(16).fill(h)));
const chain = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);

/** A libzmq publisher sending vLLM-format batches `[topic, seq, payload]`. */
async function publisher(endpoint?: string) {
  const pub = new Publisher({ linger: 0, sendHighWaterMark: 0 });
  const ep = endpoint ?? `tcp://127.0.0.1:${await freePort()}`;
  await pub.bind(ep);
  const send = (seq: number, events: KvEvent[]) =>
    pub.send([Buffer.alloc(0), seqBytes(seq), encodeBatch({ seq: BigInt(seq), ts: 0, events }, 'vllm')]);
  return { pub, endpoint: ep, send };
}

const seqBytes = (seq: number) => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(seq));
  return b;
};

/** Stores `hashes` as a chain under `parent`, one block per batch from `seq`: the next seq. */
async function sendChain(
  send: (seq: number, e: KvEvent[]) => Promise<void>,
  seq: number,
  hashes: number[],
  parent: number | null = null,
) {
  for (const [i, h] of hashes.entries())
    await send(seq + i, [storedBlock(h, i === 0 ? parent : (hashes[i - 1] as number))]);
  return seq + hashes.length;
}

function router(zmqReceive: 'native' | 'js' = 'native') {
  const warnings: string[] = [];
  const index = new RouterIndex({ blockSize: 16, zmqReceive, onWarning: (m) => warnings.push(m) });
  cleanup.push(() => index.close());
  return { index, warnings };
}

async function follow(index: RouterIndex, endpoint: string) {
  const sub = index.subscribe(W, { kind: 'zmq', endpoint });
  await until(() => sub.stats().state === 'live', 'connected');
  // ZMQ's subscription reaches the publisher just after the connection.
  await sleep(150);
  return sub;
}

const held = (index: RouterIndex, hashes: number[]) => index.findMatches(tokensOf(hashes)).device[0] ?? 0;

/**
 * A replay socket that answers every request with `replies(start)`, then the end marker if
 * `end` (vLLM's replay shape: `[identity, "", seq, payload]`).
 */
async function replaySocket(replies: (start: bigint) => AsyncIterable<[bigint, Buffer]>, end = true) {
  const router = new Router({ linger: 0, sendHighWaterMark: 0 });
  const ep = `tcp://127.0.0.1:${await freePort()}`;
  await router.bind(ep);
  cleanup.push(() => router.close());
  let requests = 0;
  void (async () => {
    try {
      for await (const [id, , start] of router) {
        requests++;
        for await (const [seq, payload] of replies((start as Buffer).readBigUInt64BE())) {
          const b = Buffer.alloc(8);
          b.writeBigUInt64BE(seq);
          await router.send([id as Buffer, Buffer.alloc(0), b, payload]);
        }
        if (end) await router.send([id as Buffer, Buffer.alloc(0), Buffer.alloc(8, 0xff), Buffer.alloc(0)]);
      }
    } catch {
      // closed
    }
  })();
  return { endpoint: ep, requests: () => requests };
}

describe("a replay socket that is not the live stream's log", () => {
  for (const mode of ['native', 'js'] as const) {
    it(`${mode}: a replayed seq far ahead of the live stream does not make every later live batch a duplicate`, async () => {
      const { pub, endpoint, send } = await publisher();
      cleanup.push(() => pub.close());
      const bogus = encodeBatch({ seq: 2n ** 62n, ts: 0, events: [storedBlock(999, null)] }, 'vllm');
      const replay = await replaySocket(async function* () {
        yield [2n ** 62n, bogus];
      });
      const { index } = router(mode);
      const sub = index.subscribe(W, { kind: 'zmq', endpoint, replayEndpoint: replay.endpoint });
      await sleep(300);
      const hashes = chain(1, 40);
      let seq = 0;
      for (const [i, h] of hashes.entries()) {
        await send(seq++, [storedBlock(h, i === 0 ? null : (hashes[i - 1] as number))]);
        await sleep(10);
      }
      // Before, the replay's seq stood as the last applied, and every live batch was a duplicate.
      await until(() => sub.stats().lastSeq === BigInt(seq - 1), `${mode}: the last live batch`, 10_000);
      expect(sub.stats().duplicates).toBeLessThan(40);
      // And what follows is indexed (a chain of its own, whatever became of the first batches).
      await send(seq++, [storedBlock(500, null)]);
      await send(seq++, [storedBlock(501, 500)]);
      await until(() => held(index, [500, 501]) === 2, `${mode}: a new chain indexed`, 10_000);
      expect(index.findMatches(tokensOf([999])).device[0] ?? 0).toBe(0);
    }, 30_000);
  }

  it('a replayed frame over 256 MiB fails the replay at once, with the reason, not after its timeout', async () => {
    const { pub, endpoint, send } = await publisher();
    cleanup.push(() => pub.close());
    const replay = await replaySocket(async function* () {
      yield [0n, Buffer.alloc(256 * 1024 * 1024 + 1)];
    });
    const warnings: string[] = [];
    const index = new RouterIndex({ blockSize: 16, onWarning: (m, d) => warnings.push(`${m}: ${d.error ?? ''}`) });
    cleanup.push(() => index.close());
    const sub = index.subscribe(W, { kind: 'zmq', endpoint, replayEndpoint: replay.endpoint });
    const t0 = performance.now();
    await until(() => warnings.some((w) => w.startsWith('engine replay failed')), 'the replay failed', 10_000);
    expect(performance.now() - t0).toBeLessThan(4000);
    expect(warnings.find((w) => w.startsWith('engine replay failed'))).toMatch(/the connection ended/);
    // The rank goes on from what follows.
    await sleep(200);
    await send(5, [storedBlock(1, null)]);
    await until(() => held(index, [1]) === 1, 'followed on', 10_000);
    expect(sub.stats().state).toBe('live');
  }, 30_000);

  it('a replay that never ends is refused once it runs further ahead of the live stream than any in flight', async () => {
    const { pub, endpoint, send } = await publisher();
    cleanup.push(() => pub.close());
    const filler = encodeBatch({ seq: 0n, ts: 0, events: [{ type: 'removed', blockHashes: [12345n] }] }, 'vllm');
    const replay = await replaySocket(async function* (start) {
      for (let s = start; ; s++) yield [s, filler];
    }, false);
    const warnings: string[] = [];
    const index = new RouterIndex({ blockSize: 16, onWarning: (m, d) => warnings.push(`${m}: ${d.error ?? ''}`) });
    cleanup.push(() => index.close());
    const sub = index.subscribe(W, { kind: 'zmq', endpoint, replayEndpoint: replay.endpoint });
    await sleep(300);
    // A live batch at 10: the replay from 0 is asked for, and never ends.
    await send(10, [storedBlock(1, null)]);
    await until(
      () => warnings.some((w) => /further ahead of the live stream/.test(w)),
      'the endless replay refused',
      15_000,
    );
    await send(11, [storedBlock(2, 1)]);
    await until(() => sub.stats().state === 'live' && sub.stats().lastSeq === 11n, 'live again', 10_000);
    expect(replay.requests()).toBeLessThanOrEqual(2);
  }, 30_000);
});

describe('native ZMQ link', () => {
  it('applies an in-order stream on its own thread, to the same index zeromq.js builds', async () => {
    const dumps = [];
    for (const mode of ['native', 'js'] as const) {
      const { pub, endpoint, send } = await publisher();
      cleanup.push(() => pub.close());
      const { index } = router(mode);
      const sub = await follow(index, endpoint);
      const hashes = chain(1, 300);
      // The first batches are the follower's (it joins by them); once it is in order, the link
      // applies what follows.
      await sendChain(send, 0, hashes.slice(0, 10));
      await until(() => held(index, hashes) === 10, `${mode}: joined`);
      const next = await sendChain(send, 10, hashes.slice(10), 10);
      await until(() => held(index, hashes) === 300, `${mode}: 300 blocks`, 10_000);
      expect(next).toBe(300);
      const s = sub.stats();
      expect(s).toMatchObject({ batches: 300, lastSeq: 299n, dropped: 0, undecodable: 0 });
      expect(s.events).toBe(300);
      // Only the batch the follower joins by is applied in JS.
      if (mode === 'native') expect(s.linkBatches).toBe(299);
      else expect(s.linkBatches).toBe(0);
      dumps.push(index.dump());
    }
    expect(dumps[0]).toEqual(dumps[1]);
  });

  it('a burst while the follower catches up is applied in seq order, each batch once, by whichever side', async () => {
    const { pub, endpoint, send } = await publisher();
    cleanup.push(() => pub.close());
    const { index } = router();
    const sub = await follow(index, endpoint);
    // The follower joins by the first batch while the rest queue up behind it: it reopens the
    // gate past them, and what arrives meanwhile is held until it has read them.
    const hashes = chain(1, 3000);
    await sendChain(send, 0, hashes);
    await until(() => sub.stats().lastSeq === 2999n, 'every batch', 20_000);
    expect(held(index, hashes)).toBe(3000);
    const s = sub.stats();
    expect(s).toMatchObject({ batches: 3000, events: 3000, duplicates: 0, dropped: 0 });
    expect(index.stats().drops.unknown_parent).toBe(0);
    // A stream in order after the burst is the link's again.
    const before = s.linkBatches;
    await sendChain(send, 3000, chain(5000, 50), 3000);
    await until(() => sub.stats().lastSeq === 3049n, 'after the burst');
    expect(sub.stats().linkBatches - before).toBe(50);
  }, 30_000);

  it('hands a gap to the follower: without replay the worker is cleared, counted, and rebuilt from what follows', async () => {
    const { pub, endpoint, send } = await publisher();
    cleanup.push(() => pub.close());
    const { index, warnings } = router();
    const recovered: Array<{ workerId: bigint; dpRank: number; kind: string }> = [];
    const emitted: string[] = [];
    index.on('recovered', (r) => recovered.push(r));
    index.on('warning', (m) => emitted.push(m));
    const sub = await follow(index, endpoint);
    await sendChain(send, 0, chain(1, 10));
    await until(() => held(index, chain(1, 10)) === 10, '10 blocks');
    // Seqs 10..19 never arrive.
    await sendChain(send, 20, chain(100, 5));
    await until(() => held(index, chain(100, 5)) === 5, 'the new chain');
    expect(held(index, chain(1, 10))).toBe(0);
    expect(sub.stats().recoveries.cleared).toBe(1);
    expect(warnings).toContain('rank cleared');
    // The same as typed events, as they happened.
    expect(recovered).toEqual([{ workerId: W, dpRank: 0, kind: 'cleared' }]);
    expect(emitted).toEqual(warnings);
    // In order again: back on the link thread.
    const before = sub.stats().linkBatches;
    await sendChain(send, 25, chain(200, 20));
    await until(() => held(index, chain(200, 20)) === 20, 'after the gap');
    expect(sub.stats().linkBatches - before).toBeGreaterThanOrEqual(19);
    expect(sub.stats().lastSeq).toBe(44n);
  });

  it('reconnects by itself; a publisher whose seqs start over is a restart: no stale block survives', async () => {
    const first = await publisher();
    const { index } = router();
    const sub = await follow(index, first.endpoint);
    await sendChain(first.send, 0, chain(1, 50));
    await until(() => held(index, chain(1, 50)) === 50, '50 blocks');
    await first.pub.close();
    await until(() => sub.stats().state !== 'live', 'disconnected');
    // The same address, a new incarnation numbering from 0.
    const again = await publisher(first.endpoint);
    cleanup.push(() => again.pub.close());
    await until(() => sub.stats().state === 'live', 'reconnected', 10_000);
    await sleep(150);
    await sendChain(again.send, 0, chain(500, 3));
    await until(() => held(index, chain(500, 3)) === 3, 'the new incarnation');
    expect(held(index, chain(1, 50))).toBe(0);
    const s = sub.stats();
    expect(s.restarts).toBe(1);
    expect(s.reconnects).toBeGreaterThanOrEqual(1);
    expect(s.lastSeq).toBe(2n);
  });

  it('skips malformed messages and undecodable payloads (counted, worker rebuilt) and keeps following', async () => {
    const { pub, endpoint, send } = await publisher();
    cleanup.push(() => pub.close());
    const { index, warnings } = router();
    const sub = await follow(index, endpoint);
    await sendChain(send, 0, chain(1, 5));
    await until(() => held(index, chain(1, 5)) === 5, '5 blocks');
    await pub.send([Buffer.alloc(0), Buffer.from([1, 2, 3]), Buffer.from('x')]);
    await pub.send([Buffer.alloc(0), seqBytes(5)]);
    await pub.send([Buffer.alloc(0), seqBytes(5), Buffer.from('not msgpack at all')]);
    await sendChain(send, 6, chain(50, 4));
    await until(() => held(index, chain(50, 4)) === 4, 'after the bad input');
    const s = sub.stats();
    expect(s.undecodable).toBe(1);
    expect(s.malformed).toBe(2);
    expect(warnings).toContain('malformed engine message skipped');
    expect(warnings).toContain('undecodable engine batch skipped; rank cleared');
    // The bad payload cleared the worker: what came before it is gone, as with zeromq.js.
    expect(held(index, chain(1, 5))).toBe(0);
  });

  it('follows an ipc:// publisher', async () => {
    const { pub, endpoint, send } = await publisher(`ipc://${join(tmpdir(), `kvplane-native-${process.pid}.ipc`)}`);
    cleanup.push(() => pub.close());
    const { index } = router();
    const sub = await follow(index, endpoint);
    await sendChain(send, 0, chain(1, 2));
    await until(() => held(index, chain(1, 20)) === 2, 'joined');
    await sendChain(send, 2, chain(3, 18), 2);
    await until(() => held(index, chain(1, 20)) === 20, '20 blocks');
    expect(sub.stats().linkBatches).toBe(19);
  });

  it('a peer that is not a ZMQ publisher is refused and retried, with the reason in lastError', async () => {
    const socks = new Set<Socket>();
    const server = createServer((sock) => {
      socks.add(sock);
      sock.end('HTTP/1.1 400 Bad Request\r\n\r\n');
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    cleanup.push(() => {
      server.close();
      for (const s of socks) s.destroy();
    });
    const port = (server.address() as { port: number }).port;
    const { index } = router();
    const sub = index.subscribe(W, { kind: 'zmq', endpoint: `tcp://127.0.0.1:${port}` });
    await until(() => sub.stats().lastError !== null, 'refused');
    expect(sub.stats().lastError).toMatch(/not a ZMTP 3 socket|early eof/);
    expect(sub.stats().state).toBe('connecting');
  });

  it('js: a connection libzmq ends for good (a refused handshake, a frame over 256 MiB) is connected again', async () => {
    // A peer whose greeting asks for CURVE, where the subscriber speaks NULL: libzmq refuses the
    // handshake and, on its own, never connects that endpoint again.
    const greeting = Buffer.alloc(64);
    greeting[0] = 0xff;
    greeting[9] = 0x7f;
    greeting[10] = 3;
    greeting.write('CURVE', 12);
    const conns: Socket[] = [];
    const curve = createServer((c: Socket) => {
      conns.push(c);
      c.on('error', () => {});
      c.write(greeting);
    });
    await new Promise<void>((r) => curve.listen(0, '127.0.0.1', r));
    const endpoint = `tcp://127.0.0.1:${(curve.address() as { port: number }).port}`;
    const warnings: Array<[string, unknown]> = [];
    const index = new RouterIndex({
      blockSize: 16,
      zmqReceive: 'js',
      onWarning: (m, d) => warnings.push([m, d.reason]),
    });
    cleanup.push(() => index.close());
    const sub = index.subscribe(W, { kind: 'zmq', endpoint });
    await until(() => /handshake refused/.test(sub.stats().lastError ?? ''), 'the refusal reported', 5000);
    expect(sub.stats().lastError).toMatch(/MECHANISM_MISMATCH|mechanism/i);
    expect(warnings.map(([m]) => m)).toContain('engine connection refused');
    // The engine comes back right: the same endpoint, a real publisher.
    const closed = new Promise((r) => curve.close(r));
    for (const c of conns) c.destroy();
    await closed;
    const { pub, send } = await publisher(endpoint);
    cleanup.push(() => pub.close());
    let seq = 0;
    /** Sends one-block roots, one batch each, until one is held. */
    const sendUntilHeld = async (what: string) => {
      const end = Date.now() + 10_000;
      for (;;) {
        const h = 1000 + seq;
        await send(seq++, [storedBlock(h, null)]);
        await sleep(100);
        if (held(index, [h]) === 1) return;
        if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
      }
    };
    await sendUntilHeld('followed once the publisher is right');

    // A frame over the bound: libzmq ends that session too (and would not connect again).
    const before = sub.stats().malformed;
    await pub.send([Buffer.alloc(0), seqBytes(seq), Buffer.alloc(256 * 1024 * 1024 + 1)]);
    await until(() => sub.stats().malformed > before, 'the frame refused', 10_000);
    expect(sub.stats().lastError).toMatch(/protocol error/);
    await sendUntilHeld('followed again after the refused frame');
  }, 40_000);

  it('js: a port that accepts and closes is connected again backing off, the reason in lastError, then followed', async () => {
    // Not a publisher: every connection closed as it is accepted. libzmq retries every 100 ms
    // however often that happens (about 30 times in 3 s, each a connect and a disconnect).
    let accepts = 0;
    const conns: Socket[] = [];
    const closer = createServer((c: Socket) => {
      accepts++;
      conns.push(c);
      c.on('error', () => {});
      c.destroy();
    });
    await new Promise<void>((r) => closer.listen(0, '127.0.0.1', r));
    const endpoint = `tcp://127.0.0.1:${(closer.address() as { port: number }).port}`;
    const index = new RouterIndex({ blockSize: 16, zmqReceive: 'js' });
    cleanup.push(() => index.close());
    const sub = index.subscribe(W, { kind: 'zmq', endpoint });
    await sleep(3000);
    // 100, 200, 400, 800 ms, ... (up to 5 s): the native link's backoff.
    expect(accepts).toBeGreaterThanOrEqual(3);
    expect(accepts).toBeLessThanOrEqual(8);
    expect(sub.stats().lastError).toMatch(/before its handshake \(\d+ in a row\); connecting again in \d+ ms/);
    expect(sub.stats().state).not.toBe('live');
    // A publisher takes the port: followed within the backoff's wait.
    const closed = new Promise((r) => closer.close(r));
    for (const c of conns) c.destroy();
    await closed;
    const { pub, send } = await publisher(endpoint);
    cleanup.push(() => pub.close());
    const end = Date.now() + 10_000;
    for (let seq = 0; held(index, [2000 + seq - 1]) !== 1; seq++) {
      if (Date.now() > end) throw new Error('not followed');
      await send(seq, [storedBlock(2000 + seq, null)]);
      await sleep(100);
    }
  }, 30_000);

  it('probes its connections to publishers with TCP keepalive (a dead host or a partition is noticed however quiet), native and js', async () => {
    for (const zmqReceive of ['native', 'js'] as const) {
      const { pub, endpoint } = await publisher();
      cleanup.push(() => pub.close());
      const index = new RouterIndex({ blockSize: 16, zmqReceive });
      cleanup.push(() => index.close());
      const sub = index.subscribe(W, { kind: 'zmq', endpoint });
      await until(() => sub.stats().state === 'live', `${zmqReceive}: connected`, 10_000);
      // The kernel's view of the subscriber's connection: a keepalive timer on an idle socket.
      const port = endpoint.split(':').at(-1) as string;
      const { stdout } = await execFileP('ss', ['-tnoH', 'state', 'established', `( dport = :${port} )`]);
      expect([zmqReceive, stdout]).toEqual([zmqReceive, expect.stringMatching(/timer:\(keepalive,/)]);
    }
  });

  it('a closed index lets the process exit: its links hold nothing that keeps Node running', async () => {
    const port = await freePort();
    // Closed 300 ms after subscribing, and in the same tick: a link opened after that close (the
    // subscription was still starting) would never close.
    for (const wait of ['await new Promise((r) => setTimeout(r, 300));', '']) {
      const script = `
        import { RouterIndex } from ${JSON.stringify(repoPath('dist/index.mjs'))};
        const index = new RouterIndex({ blockSize: 16 });
        index.subscribe(1n, { kind: 'zmq', endpoint: 'tcp://127.0.0.1:${port}' });
        ${wait}
        await index.close();
        console.log('closed');
      `;
      const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
        encoding: 'utf8',
        timeout: 10_000,
      });
      expect([wait, r.stdout.trim(), r.signal, r.status]).toEqual([wait, 'closed', null, 0]);
    }
  });
});
