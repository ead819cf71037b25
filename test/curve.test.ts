import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterEach, describe, expect, it } from 'vitest';
import { curveKeyPair, Subscriber } from 'zeromq';
import { KvEventPublisher, KvPlaneError, readCurveClients, readCurveSecretKey } from '../src/index.js';
import { repoPath, serveNode, sleep } from './fixtures.js';

const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

/** Runs `scripts/zmq_peer.py` (pyzmq) until it has printed `lines` JSON lines, with CURVE keys from `env`. */
function pyzmq(args: string[], lines: number, env: Record<string, string> = {}): Promise<unknown[]> {
  const p = spawn('python3', [repoPath('scripts/zmq_peer.py'), ...args], { env: { ...process.env, ...env } });
  cleanup.push(() => p.kill());
  let err = '';
  p.stderr.on('data', (d) => (err += d));
  const out: unknown[] = [];
  return new Promise((resolve, reject) => {
    createInterface({ input: p.stdout }).on('line', (l) => {
      out.push(JSON.parse(l));
      if (out.length === lines) resolve(out);
    });
    p.on('close', (code) =>
      reject(new Error(`zmq_peer.py ${args[0]} exited ${code} after ${out.length} lines: ${err}`)),
    );
  });
}

/** Batches a subscriber receives within `ms`. */
async function received(sub: Subscriber, ms: number): Promise<number> {
  let n = 0;
  const reading = (async () => {
    for await (const _ of sub) n++;
  })().catch(() => {});
  await sleep(ms);
  sub.close();
  await reading;
  return n;
}

function subscriber(endpoint: string, curve?: { serverKey: string; publicKey: string; secretKey: string }): Subscriber {
  const sub = new Subscriber({
    linger: 0,
    ...(curve
      ? { curveServerKey: curve.serverKey, curvePublicKey: curve.publicKey, curveSecretKey: curve.secretKey }
      : {}),
  });
  cleanup.push(() => sub.close());
  sub.connect(endpoint);
  sub.subscribe();
  return sub;
}

describe('CURVE on the ZMQ sockets', () => {
  it('serves pyzmq clients holding an allowed certificate, live and replay, and refuses the others', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvplane-curve-'));
    const [certs] = (await pyzmq(['certs', dir], 1)) as Array<{ server_public: string }>;
    const node = await serveNode(
      [
        '--http-port',
        '0',
        '--zmq-curve-secret-file',
        join(dir, 'server.key_secret'),
        '--zmq-curve-clients',
        join(dir, 'clients'),
      ],
      cleanup,
    );
    expect(node.serving.curve_public_key).toBe(certs?.server_public);
    const allowed = {
      KVPLANE_CURVE_CLIENT: join(dir, 'client.key_secret'),
      KVPLANE_CURVE_SERVER: join(dir, 'server.key'),
    };

    // pyzmq, as a vLLM consumer would connect with CURVE: live batches, then a replay from the first.
    const live = (await pyzmq(['sub', node.serving.endpoint as string, '3'], 4, allowed)) as Array<{ seq: string }>;
    expect(live[0]).toBe('ready');
    const first = BigInt((live[1] as { seq: string }).seq);
    const replayed = (await pyzmq(
      ['replay', node.serving.replay_endpoint as string, String(first), 'dealer'],
      2,
      allowed,
    )) as Array<{
      seq: string;
    }>;
    expect(BigInt(replayed[0]?.seq as string)).toBe(first);

    // A plain client and a CURVE client whose key is not allowed get nothing.
    const stranger = readFileSync(join(dir, 'stranger.key_secret'), 'utf8');
    const key = (kind: string) => new RegExp(`${kind}-key = "(.{40})"`).exec(stranger)?.[1] as string;
    const refused = subscriber(node.serving.endpoint as string, {
      serverKey: certs?.server_public as string,
      publicKey: key('public'),
      secretKey: key('secret'),
    });
    const plain = subscriber(node.serving.endpoint as string);
    const [fromRefused, fromPlain] = await Promise.all([received(refused, 1500), received(plain, 1500)]);
    expect(fromRefused).toBe(0);
    expect(fromPlain).toBe(0);
    const metrics = await (await fetch(`${node.serving.http}/metrics`)).text();
    const count = Number(/^kvplane_zmq_auth_refused_total (\d+)$/m.exec(metrics)?.[1]);
    expect(count).toBeGreaterThanOrEqual(1);
  }, 60_000);

  it('without an allow-list, any client holding the public key is served, and nothing else changes', async () => {
    const server = curveKeyPair();
    const pub = await KvEventPublisher.create({
      endpoint: 'tcp://127.0.0.1:*',
      replayEndpoint: null,
      curve: { secretKey: server.secretKey },
    });
    cleanup.push(() => pub.close());
    expect(pub.curvePublicKey).toBe(server.publicKey);
    const client = curveKeyPair();
    const sub = subscriber(pub.endpoint, { serverKey: server.publicKey, ...client });
    const plain = subscriber(pub.endpoint);
    const timer = setInterval(
      () => pub.publish([{ type: 'stored', blockHashes: [1n], parentBlockHash: null, tokenIds: [1, 2], blockSize: 2 }]),
      20,
    );
    cleanup.push(() => clearInterval(timer));
    const [got, gotPlain] = await Promise.all([received(sub, 1000), received(plain, 1000)]);
    expect(got).toBeGreaterThan(5);
    expect(gotPlain).toBe(0);
    expect(pub.stats().authRefused).toBe(0);
  });

  it('rejects keys that are not CURVE keys with a typed error', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvplane-curve-'));
    await pyzmq(['certs', dir], 1);
    expect(readCurveClients(join(dir, 'clients'))).toHaveLength(1);
    expect(readCurveSecretKey(join(dir, 'server.key_secret'))).toHaveLength(40);
    const bad = KvEventPublisher.create({ endpoint: 'tcp://127.0.0.1:*', curve: { secretKey: 'not a key' } });
    await expect(bad).rejects.toBeInstanceOf(KvPlaneError);
    await expect(bad).rejects.toMatchObject({ code: 'ERR_INVALID_ARG', message: /not a CURVE key/ });
    // A bad key registers nothing: a valid publisher opens afterwards.
    const pub = await KvEventPublisher.create({
      endpoint: 'tcp://127.0.0.1:*',
      curve: { secretKey: curveKeyPair().secretKey, allowedClients: [curveKeyPair().publicKey] },
    });
    await pub.close();
  });
});
