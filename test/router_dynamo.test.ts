import { afterEach, describe, expect, it } from 'vitest';
import { hashBlocks } from '../dist/index.mjs';
import { canonical, dynamoAvailable, followedSideBySide, post, queriesFrom } from './router_fixtures.js';

const BS = 16;
const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

describe.skipIf(!dynamoAvailable())(
  "kvplane indexer against Dynamo's standalone indexer (PyPI ai-dynamo-runtime 1.6.1)",
  () => {
    it('follows the same simulated nodes and answers thousands of /query requests identically at quiescence', async () => {
      const { nodes, dynamo, ours, extra } = await followedSideBySide(cleanup, {
        nodes: 4,
        seed: 3,
        steps: 120,
        blockSize: BS,
        extraOn: 1,
      });

      const queries = queriesFrom(nodes, 3000, BS, 11);
      const requests: Array<Record<string, unknown>> = queries.map((q) => ({ token_ids: [...q], model_name: 'm' }));
      requests.push(
        { token_ids: [...extra], model_name: 'm' },
        { token_ids: [...extra.subarray(0, 3 * BS + 5)], model_name: 'm' },
        { token_ids: [...extra], model_name: 'm', lora_name: 'adapter-a' },
        { token_ids: [...extra], model_name: 'm', lora_name: 'adapter-b' },
        { token_ids: [...extra], model_name: 'm', cache_salt: 'salt' },
      );
      const differ: unknown[] = [];
      let matched = 0;
      const depths = new Set<number>();
      for (const body of requests) {
        const [a, b] = await Promise.all([post(dynamo.url, '/query', body), post(ours.url, '/query', body)]);
        expect(a.status).toBe(200);
        expect(b.status).toBe(200);
        if (canonical(a.json) !== canonical(b.json)) differ.push({ body, dynamo: a.json, kvplane: b.json });
        const scores = Object.values(b.json.scores as Record<string, Record<string, number>>).flatMap(Object.values);
        if (scores.length > 0) matched++;
        for (const s of scores) depths.add(s);
      }
      // /query_by_hash: the blocks' own content hashes, as i64 (Dynamo's wire form), written exactly.
      for (const q of queries.slice(0, 300)) {
        const hashes = hashBlocks(q, { algo: 'xxh3_content', blockSize: BS });
        const body = `{"model_name":"m","block_hashes":[${[...hashes].map((h) => BigInt.asIntN(64, h)).join(',')}]}`;
        const [a, b] = await Promise.all([
          post(dynamo.url, '/query_by_hash', body),
          post(ours.url, '/query_by_hash', body),
        ]);
        expect(b.status).toBe(a.status);
        if (canonical(a.json) !== canonical(b.json)) differ.push({ byHash: body, dynamo: a.json, kvplane: b.json });
      }
      expect(differ.slice(0, 3)).toEqual([]);
      // Token ids that are not u32s (a string, null, a boolean, a fraction, out of range): refused
      // by both with the same status.
      for (const token_ids of [[1, '2'], [1, null], [true], [1, 2.5], [1, -1], [1, 2 ** 32], 'abc']) {
        const body = { token_ids, model_name: 'm' };
        const [a, b] = await Promise.all([post(dynamo.url, '/query', body), post(ours.url, '/query', body)]);
        expect([token_ids, b.status]).toEqual([token_ids, a.status]);
        expect(b.status).toBe(422);
      }
      // Content types: JSON's own and its `+json` kinds taken, others refused, by both.
      for (const type of [
        'Application/JSON',
        'application/json; charset=utf-8',
        'application/problem+json',
        'application/jsonx',
        'application/x-json',
        'text/json',
        'application/json, text/plain',
      ]) {
        const body = JSON.stringify({ token_ids: [1, 2], model_name: 'm' });
        const send = (url: string) =>
          fetch(`${url}/query`, { method: 'POST', headers: { 'content-type': type }, body }).then((r) => r.status);
        const [a, b] = await Promise.all([send(dynamo.url), send(ours.url)]);
        expect([type, b]).toEqual([type, a]);
      }
      // Bodies that are not what they claim, refused by both with the same status: a string shaped
      // like the exact-integer reading's own marker, a long integer where a name goes, integers
      // with leading zeros (not JSON), bytes that are not UTF-8.
      const reg = '"endpoint":"tcp://127.0.0.1:9","block_size":16';
      for (const [route, body] of [
        ['/register', `{"instance_id":"\\u0000int:16","model_name":"zz",${reg}}`],
        ['/register', `{"instance_id":77,"model_name":12345678901234567890,${reg}}`],
        // Half a surrogate pair, escaped: no Unicode text.
        ['/register', `{"instance_id":77,"model_name":"z\\ud800",${reg}}`],
        ['/register', `{"instance_id":00000000000000000077,"model_name":"zz",${reg}}`],
        ['/query_by_hash', '{"block_hashes":[-00000000000000001],"model_name":"m"}'],
        // Whole numbers written as floats are not integers to either.
        ['/query_by_hash', '{"block_hashes":[1.0],"model_name":"m"}'],
        ['/query', '{"token_ids":[1,2.0],"model_name":"m"}'],
        ['/query', '{"token_ids":[1e2],"model_name":"m"}'],
        ['/register', Buffer.from(`{"instance_id":77,"model_name":"z\xff",${reg}}`, 'latin1')],
      ] as const) {
        const [a, b] = await Promise.all([post(dynamo.url, route, body), post(ours.url, route, body)]);
        expect([String(body), b.status]).toEqual([String(body), a.status]);
        expect(b.status).toBeGreaterThanOrEqual(400);
      }
      // The queries hit caches at many depths, not just the shared prompts.
      expect(matched).toBeGreaterThan(2000);
      expect(depths.size).toBeGreaterThan(20);
      // The tiers and the LoRA namespace were exercised: device, then host, then disk.
      const tiered = (await post(ours.url, '/query', { token_ids: [...extra], model_name: 'm' })).json;
      expect(tiered.instances['2']).toMatchObject({ gpu: 2 * BS, cpu: 3 * BS, disk: 4 * BS, longest_matched: 4 * BS });
      const lora = (await post(ours.url, '/query', { token_ids: [...extra], model_name: 'm', lora_name: 'adapter-a' }))
        .json;
      expect(lora.scores).toEqual({ '2': { '0': 2 * BS } });

      // Dynamo's indexer's own metric families, by name, type, labels and buckets, and the
      // request counts both took (the same requests, and the two queries above to kvplane alone).
      const families = async (base: string) => {
        const text = await (await fetch(`${base}/metrics`)).text();
        const out: Record<string, { type: string; labels: string[]; les: string[] }> = {};
        for (const [, n, type] of text.matchAll(/^# TYPE (dynamo_kvindexer_\S+) (\S+)$/gm))
          out[n as string] = { type: type as string, labels: [], les: [] };
        for (const [, n, labels] of text.matchAll(
          /^(dynamo_kvindexer_[a-z_]+?)(?:_bucket|_sum|_count)?\{([^}]*)\}/gm,
        )) {
          const f = out[n as string];
          if (f === undefined) continue;
          for (const [, k, v] of (labels as string).matchAll(/(\w+)="([^"]*)"/g)) {
            if (k === 'le') f.les.includes(v as string) || f.les.push(v as string);
            else f.labels.includes(k as string) || f.labels.push(k as string);
          }
        }
        const value = (series: string) =>
          Number(text.match(new RegExp(`^${series.replace(/[{}]/g, '\\$&')} (\\S+)$`, 'm'))?.[1] ?? Number.NaN);
        return { families: out, value };
      };
      const [dynamoMetrics, ourMetrics] = await Promise.all([families(dynamo.url), families(ours.url)]);
      expect(Object.keys(dynamoMetrics.families).length).toBeGreaterThanOrEqual(6);
      for (const [n, f] of Object.entries(dynamoMetrics.families)) {
        expect([n, ourMetrics.families[n]?.type]).toEqual([n, f.type]);
        expect([n, [...(ourMetrics.families[n]?.labels ?? [])].sort()]).toEqual([n, [...f.labels].sort()]);
        expect([n, ourMetrics.families[n]?.les]).toEqual([n, f.les]);
      }
      const queryCount = 'dynamo_kvindexer_requests_total{endpoint="/query",method="POST"}';
      expect(ourMetrics.value(queryCount)).toBe(dynamoMetrics.value(queryCount) + 2);
      for (const series of [
        'dynamo_kvindexer_requests_total{endpoint="/query_by_hash",method="POST"}',
        'dynamo_kvindexer_errors_total{endpoint="/query",status_class="4xx"}',
        'dynamo_kvindexer_models',
        'dynamo_kvindexer_workers',
        'dynamo_kvindexer_listeners{status="active"}',
      ])
        expect([series, ourMetrics.value(series)]).toEqual([series, dynamoMetrics.value(series)]);
      // The engine events both applied, by type and outcome: every series of Dynamo's, the same
      // counts.
      const applied = async (base: string) =>
        [
          ...(await (await fetch(`${base}/metrics`)).text()).matchAll(
            /^dynamo_kvrouter_kv_cache_events_applied\{([^}]*)\} (\S+)$/gm,
          ),
        ]
          .map(([, labels, v]) => `${labels} ${Number(v)}`)
          .sort();
      const [theirApplied, ourApplied] = await Promise.all([applied(dynamo.url), applied(ours.url)]);
      expect(theirApplied.length).toBe(27);
      expect(ourApplied).toEqual(theirApplied);
      expect(ourApplied.find((l) => l.startsWith('event_type="stored",status="ok"'))).not.toMatch(/ 0$/);
    }, 180_000);
  },
);
