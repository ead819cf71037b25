import { mkdtempSync, readFileSync, renameSync } from 'node:fs';
import { createServer } from 'node:http';
import { type AddressInfo, createServer as createNetServer, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { IndexerServer } from '../dist/index.mjs';
import { sleep, until } from './fixtures.js';
import {
  canonical,
  type DynamoIndexer,
  dumpCounts,
  dynamoAvailable,
  followedSideBySide,
  post,
  queriesFrom,
  run,
  startDynamoIndexer,
} from './router_fixtures.js';

const BS = 16;
const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

// biome-ignore lint/suspicious/noExplicitAny: JSON answers, read field by field
type Json = any;

/** `/query` answers of `a` and `b` that differ, over `requests`. */
async function differences(a: string, b: string, requests: readonly Json[]): Promise<Json[]> {
  const differ: Json[] = [];
  for (const body of requests) {
    const [x, y] = await Promise.all([post(a, '/query', body), post(b, '/query', body)]);
    if (x.status !== y.status || canonical(x.json) !== canonical(y.json)) differ.push({ body, [a]: x, [b]: y });
  }
  return differ;
}

describe.skipIf(!dynamoAvailable())(
  "peer indexers (Dynamo's P2P recovery) with Dynamo's standalone indexer 1.6.1",
  () => {
    it("each starts from the other's /dump: Dynamo from kvplane's, kvplane from Dynamo's and from kvplane's, and answers as the peer does", async () => {
      // kvplane's /dump with each block's tokens_hash, which Dynamo needs.
      const { nodes, dynamo, ours, extra } = await followedSideBySide(cleanup, {
        nodes: 3,
        seed: 7,
        steps: 80,
        blockSize: BS,
        extraOn: 2,
        groups: ['default', 'g2'],
        opts: { dumpTokensHash: true },
      });
      const queries = queriesFrom(nodes, 800, BS, 5);
      const requests: Json[] = [...queries.map((q) => ({ token_ids: [...q], model_name: 'm' }))];
      requests.push(
        ...queries.slice(0, 200).map((q) => ({ token_ids: [...q], model_name: 'm', routing_group: 'g2' })),
        { token_ids: [...extra], model_name: 'm' },
        { token_ids: [...extra], model_name: 'm', lora_name: 'adapter-a' },
      );
      // The two agree before anything starts from a peer.
      expect((await differences(dynamo.url, ours.url, requests)).slice(0, 2)).toEqual([]);
      const tiered = (await post(ours.url, '/query', { token_ids: [...extra], model_name: 'm' })).json;
      expect(tiered.instances['3']).toMatchObject({ gpu: 2 * BS, cpu: 3 * BS, disk: 4 * BS });

      // Dynamo, started with kvplane as its peer (no workers of its own): it reads kvplane's dump
      // and answers every query as kvplane does.
      const fromOurs: DynamoIndexer = await startDynamoIndexer(1, ['--peers', ours.url]);
      cleanup.push(() => fromOurs.stop());
      await until(() => /recovery from peer succeeded/.test(fromOurs.log()), 'Dynamo recovered from kvplane');
      expect(fromOurs.log()).not.toMatch(/failed to parse dump/);
      expect(await dumpCounts(fromOurs.url)).toEqual(await dumpCounts(ours.url));
      expect((await differences(fromOurs.url, ours.url, requests)).slice(0, 2)).toEqual([]);

      // kvplane, started with Dynamo as its peer: the same. A first peer that is not listening is
      // passed over, with a warning.
      const warnings: string[] = [];
      const fromDynamo = await IndexerServer.create({
        host: '127.0.0.1',
        port: 0,
        peers: ['http://127.0.0.1:9', dynamo.url],
        onWarning: (msg) => warnings.push(msg),
      });
      cleanup.push(() => fromDynamo.close());
      expect(warnings).toEqual(['recovery from a peer failed, trying the next']);
      expect(fromDynamo.peerRecovery?.peer).toBe(dynamo.url);
      expect(fromDynamo.peerRecovery?.indexes.map((i) => i.name).sort()).toEqual(['m:default', 'm:g2']);
      expect(await dumpCounts(fromDynamo.url)).toEqual(await dumpCounts(dynamo.url));
      expect((await differences(fromDynamo.url, dynamo.url, requests)).slice(0, 2)).toEqual([]);
      expect(
        (await post(fromDynamo.url, '/query', { token_ids: [...extra], model_name: 'm' })).json.instances['3'],
      ).toEqual(tiered.instances['3']);

      // kvplane from kvplane, following the nodes itself from its start (`--workers`) while they
      // publish: what arrives before the dump is loaded is held and applied over it, as is what
      // comes after, and it ends up where the peer is.
      const replicaOf = (peerDelayMs: number) =>
        IndexerServer.create({
          host: '127.0.0.1',
          port: 0,
          peers: [ours.url],
          peerDelayMs,
          workers: nodes.map((n) => ({
            instanceId: n.id,
            dpRank: 0,
            endpoint: n.endpoint,
            modelName: 'm',
            routingGroup: 'default',
            blockSize: BS,
          })),
        });
      // One started while the nodes are idle: their next batches come after the dump is loaded
      // (a subscription joining without a replay, by itself, would clear the worker on its first).
      const idle = await replicaOf(100);
      cleanup.push(() => idle.close());
      // One started while they publish.
      const stepping = run(nodes, 30);
      const busy = await replicaOf(300);
      cleanup.push(() => busy.close());
      await stepping;
      for (const r of [idle, busy]) expect(r.peerRecovery?.peer).toBe(ours.url);
      await run(nodes, 40);
      const caughtUp = (s: IndexerServer) => {
        const x = s.registry.index('m', 'default');
        return nodes.every((n) => x.subscription(n.id)?.stats().lastSeq === n.publisher.stats().lastSeq);
      };
      await until(() => [ours, idle, busy].every(caughtUp), 'all caught up');
      const live = queriesFrom(nodes, 600, BS, 9).map((q) => ({ token_ids: [...q], model_name: 'm' }));
      const held = async (base: string) => (await dumpCounts(base)).filter(([k]) => k.startsWith('m:default/'));
      for (const replica of [idle, busy]) {
        expect(await held(replica.url)).toEqual(await held(ours.url));
        expect((await differences(replica.url, ours.url, live)).slice(0, 2)).toEqual([]);
      }
      // Without --dump-tokens-hash (the replicas), /dump carries kvplane's keys alone: Dynamo
      // cannot start from it, and says so.
      const blocks = (await (await fetch(`${idle.url}/dump`)).json())['m:default'].events[0].event.data.stored.blocks;
      expect(Object.keys(blocks[0]).sort()).toEqual(['block_hash', 'kvplane_key', 'mm_extra_info']);
      const refused = await startDynamoIndexer(1, ['--peers', idle.url]);
      cleanup.push(() => refused.stop());
      await until(() => /failed to parse dump response/.test(refused.log()), 'Dynamo refused the dump');
    }, 180_000);

    it('keeps a list of peers as Dynamo does, saved with the registrations; refuses what is not a URL', async () => {
      const dynamo = await startDynamoIndexer(1);
      cleanup.push(() => dynamo.stop());
      const dir = mkdtempSync(join(tmpdir(), 'kvplane-peers-'));
      const stateFile = join(dir, 'state.json');
      const ours = await IndexerServer.create({
        host: '127.0.0.1',
        port: 0,
        stateFile,
        peers: ['http://127.0.0.1:1'],
      });
      cleanup.push(() => ours.close());
      await post(dynamo.url, '/register_peer', { url: 'http://127.0.0.1:1' });
      const steps: Array<[string, string, Json]> = [
        ['POST', '/register_peer', { url: 'http://127.0.0.1:2' }],
        ['POST', '/register_peer', { url: 'http://127.0.0.1:2' }],
        ['GET', '/peers', null],
        ['POST', '/deregister_peer', { url: 'http://127.0.0.1:3' }],
        ['POST', '/deregister_peer', { url: 'http://127.0.0.1:1' }],
        ['GET', '/peers', null],
        ['POST', '/register_peer', {}],
        ['POST', '/register_peer', { url: 5 }],
        ['GET', '/register_peer', null],
        ['POST', '/reopen_logs', {}],
      ];
      for (const [method, path, body] of steps) {
        const ask = async (base: string) => {
          if (method === 'POST') return post(base, path, body);
          const res = await fetch(`${base}${path}`);
          const text = await res.text();
          return { status: res.status, json: text === '' ? null : JSON.parse(text) };
        };
        const [a, b] = await Promise.all([ask(dynamo.url), ask(ours.url)]);
        expect([method, path, body, b.status]).toEqual([method, path, body, a.status]);
        // Dynamo keeps its peers in a hash set (any order); kvplane in the order they came.
        const sorted = (j: Json) => (Array.isArray(j) ? [...j].sort() : j);
        if (a.status < 300 || path === '/peers') expect([path, sorted(b.json)]).toEqual([path, sorted(a.json)]);
      }
      // Saved: a restart keeps them, and asks them (here nothing listens: it starts empty).
      expect(JSON.parse(readFileSync(stateFile, 'utf8')).peers).toEqual(['http://127.0.0.1:2']);
      const warnings: string[] = [];
      const again = await IndexerServer.create({
        host: '127.0.0.1',
        port: 0,
        stateFile,
        onWarning: (msg) => warnings.push(msg),
      });
      cleanup.push(() => again.close());
      expect(await (await fetch(`${again.url}/peers`)).json()).toEqual(['http://127.0.0.1:2']);
      expect(warnings).toEqual([
        'recovery from a peer failed, trying the next',
        'no peer answered /dump: starting with an empty index',
      ]);
      expect(again.peerRecovery).toBeNull();
      // Dynamo lists anything; kvplane only URLs it could ask.
      for (const url of ['not a url', 'ftp://x', '', 'http://h:1/?q=1']) {
        expect((await post(dynamo.url, '/register_peer', { url })).status).toBe(201);
        const r = await post(ours.url, '/register_peer', { url });
        expect(r.status).toBe(400);
        expect(typeof r.json.error).toBe('string');
      }
    }, 60_000);

    it("writes Dynamo's access log lines, and opens the file again on /reopen_logs", async () => {
      const dir = mkdtempSync(join(tmpdir(), 'kvplane-access-'));
      const dynamoLog = join(dir, 'dynamo.log');
      const ourLog = join(dir, 'ours.log');
      const dynamo = await startDynamoIndexer(1, ['--access-log', dynamoLog, '--trace-id-header', 'x-req']);
      cleanup.push(() => dynamo.stop());
      const ours = await IndexerServer.create({
        host: '127.0.0.1',
        port: 0,
        accessLog: ourLog,
        traceIdHeader: 'x-req',
      });
      cleanup.push(() => ours.close());
      const requests: Array<[string, string, string | null, Record<string, string>]> = [
        ['GET', '/peers', null, { 'x-req': 'trace-1' }],
        ['POST', '/query', '{"token_ids":[1,2],"model_name":"mq"}', {}],
        [
          'POST',
          '/register',
          '{"instance_id":1,"endpoint":"tcp://127.0.0.1:9","model_name":"mr","block_size":16}',
          { 'x-trace-id': 'ignored' },
        ],
        ['POST', '/unregister', 'bad', {}],
        ['PUT', '/peers', null, {}],
        ['GET', '/health', null, {}],
        ['GET', '/nope', null, {}],
      ];
      for (const base of [dynamo.url, ours.url]) {
        for (const [method, path, body, headers] of requests) {
          const init: RequestInit = { method, headers: { ...headers } };
          if (body !== null) {
            init.body = body;
            (init.headers as Record<string, string>)['content-type'] = 'application/json';
          }
          await (await fetch(`${base}${path}`, init)).text();
        }
      }
      const lines = async (path: string, n: number) => {
        let got: Json[] = [];
        await until(() => {
          try {
            got = readFileSync(path, 'utf8')
              .trim()
              .split('\n')
              .filter(Boolean)
              .map((l) => JSON.parse(l));
          } catch {
            return false;
          }
          return got.length >= n;
        }, `${n} lines in ${path}`);
        return got;
      };
      // Less the /health requests that waited for it to start.
      const theirs = (await lines(dynamoLog, 7)).slice(-6);
      const mine = await lines(ourLog, 6);
      const shape = (l: Json) => ({ ...l, ts: typeof l.ts, duration_ms: typeof l.duration_ms });
      expect(mine.map(shape)).toEqual(theirs.map(shape));
      expect(mine.map((l) => l.path)).toEqual(['/peers', '/query', '/register', '/unregister', '/peers', '/health']);
      for (const l of mine) expect(l.ts).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);

      // A rotation: the file moved away, /reopen_logs, and the next lines (its own first, as
      // Dynamo writes it) go to a new file.
      renameSync(ourLog, `${ourLog}.1`);
      expect((await post(ours.url, '/reopen_logs', {})).status).toBe(200);
      await fetch(`${ours.url}/peers`).then((r) => r.text());
      const after = await lines(ourLog, 2);
      expect(after.map((l) => l.path)).toEqual(['/reopen_logs', '/peers']);
      expect(readFileSync(`${ourLog}.1`, 'utf8').trim().split('\n').length).toBe(6);

      // A log that cannot be written: requests are answered, the lines lost are counted.
      const broken = await IndexerServer.create({ host: '127.0.0.1', port: 0, accessLog: join(dir, 'gone', 'x.log') });
      cleanup.push(() => broken.close());
      for (let i = 0; i < 3; i++) expect((await fetch(`${broken.url}/peers`)).status).toBe(200);
      const lost = async () =>
        Number(
          /^kvplane_indexer_access_log_errors_total (\d+)$/m.exec(
            await (await fetch(`${broken.url}/metrics`)).text(),
          )?.[1],
        );
      for (let i = 0; i < 100 && (await lost()) < 3; i++) await sleep(20);
      expect(await lost()).toBeGreaterThanOrEqual(3);
    }, 60_000);
  },
);

describe('peer indexers that do not answer as peers', () => {
  it('are passed over: one that accepts and never answers (after 5 s), one that answers something else, one that answers 404', async () => {
    const silent = createNetServer(() => {});
    const other = createServer((req, res) => {
      if (req.url === '/dump') res.end(req.headers.host?.endsWith(':1') ? '' : '{"m:default":{"events":[]}}');
      else res.end();
    });
    const missing = createServer((_req, res) => {
      res.statusCode = 404;
      res.end();
    });
    const held: Socket[] = [];
    silent.on('connection', (c) => held.push(c));
    for (const s of [silent, other, missing]) {
      await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
      cleanup.push(() => new Promise((r) => s.close(r)));
    }
    cleanup.push(() => {
      for (const c of held) c.destroy();
      other.closeAllConnections();
      missing.closeAllConnections();
    });
    const at = (s: { address(): unknown }) => `http://127.0.0.1:${(s.address() as AddressInfo).port}`;
    const warnings: Array<[string, Json]> = [];
    const t0 = Date.now();
    const ours = await IndexerServer.create({
      host: '127.0.0.1',
      port: 0,
      peers: [at(silent), at(other), `${at(missing)}/`],
      onWarning: (msg, detail) => warnings.push([msg, detail]),
    });
    cleanup.push(() => ours.close());
    expect(Date.now() - t0).toBeGreaterThanOrEqual(4900);
    expect(warnings.map(([m]) => m)).toEqual([
      'recovery from a peer failed, trying the next',
      'a peer answered /dump with something else, trying the next',
      'recovery from a peer failed, trying the next',
      'no peer answered /dump: starting with an empty index',
    ]);
    expect(warnings[0]?.[1].error).toMatch(/no answer within 5000 ms/);
    expect(warnings[1]?.[1].error).toMatch(/ERR_DECODE|block_size/);
    expect(warnings[2]?.[1].error).toMatch(/HTTP 404/);
    expect(ours.peerRecovery).toBeNull();
    expect((await (await fetch(`${ours.url}/health`)).json()).status).toBe('ok');
  }, 30_000);
});
