import { execFile } from 'node:child_process';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, request, type ServerResponse } from 'node:http';
import { type AddressInfo, connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { decode as msgpackDecode, encode as msgpackEncode } from '@msgpack/msgpack';
import { afterEach, describe, expect, it } from 'vitest';
import { IndexerServer, KvEventPublisher, KvGrpcServer, KvHttpServer, RouterIndex } from '../dist/index.mjs';
import { rawHttp, sleep, until } from './fixtures.js';
import { post } from './router_fixtures.js';

const execFileP = promisify(execFile);
const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

async function indexer(): Promise<IndexerServer> {
  const ix = await IndexerServer.create({ host: '127.0.0.1', port: 0 });
  cleanup.push(() => ix.close());
  return ix;
}

/** An HTTP server on a free loopback port, closed after the test: its base URL. */
async function serveLocal(handle: (req: IncomingMessage, res: ServerResponse) => unknown): Promise<string> {
  const server = createServer(handle);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  cleanup.push(() => new Promise((r) => server.close(r)));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

/** A raw request: status, content type and body text. */
function raw(url: string, method: string, path: string, body: string | Buffer, type = 'application/json') {
  return new Promise<{ status: number; type: string; text: string }>((resolve, reject) => {
    const req = request(`${url}${path}`, { method, headers: { 'content-type': type } }, (res) => {
      let text = '';
      res.on('data', (c) => (text += c));
      res.on('end', () =>
        resolve({ status: res.statusCode as number, type: String(res.headers['content-type']), text }),
      );
    });
    req.on('error', reject);
    req.end(body);
  });
}

const REG = { instance_id: 1, endpoint: 'tcp://127.0.0.1:1', model_name: 'm', block_size: 16 };

describe('kvplane indexer HTTP API: bad input', () => {
  it('answers every bad request at every route with a 4xx JSON error and keeps serving', async () => {
    const ix = await indexer();
    const cases: Array<[string, string, string | Buffer, number, string?]> = [
      ['POST', '/register', '{"instance_id":', 400],
      ['POST', '/register', '', 400],
      ['POST', '/register', '[1,2]', 422],
      ['POST', '/register', JSON.stringify({ ...REG, endpoint: undefined }), 422],
      ['POST', '/register', JSON.stringify({ ...REG, instance_id: '1' }), 422],
      ['POST', '/register', JSON.stringify({ ...REG, instance_id: -1 }), 422],
      [
        'POST',
        '/register',
        '{"instance_id":18446744073709551616,"endpoint":"tcp://h:1","model_name":"m","block_size":16}',
        422,
      ],
      ['POST', '/register', JSON.stringify({ ...REG, block_size: 1.5 }), 422],
      ['POST', '/register', JSON.stringify({ ...REG, endpoint: 'udp://x:1' }), 400],
      ['POST', '/register', JSON.stringify({ ...REG, endpoint: 'tcp://127.0.0.1' }), 400],
      ['POST', '/register', JSON.stringify({ ...REG, endpoint: 'tcp://h:99999' }), 400],
      ['POST', '/register', JSON.stringify({ ...REG, replay_endpoint: 'foo' }), 400],
      ['POST', '/register', JSON.stringify({ ...REG, endpoint: 'tcp://*:5557' }), 400],
      ['POST', '/register', JSON.stringify({ ...REG, endpoint: undefined, url: 'ftp://x' }), 400],
      ['POST', '/register', JSON.stringify({ ...REG, endpoint: undefined, url: 'http://127.0.0.1:1' }), 502],
      ['POST', '/register', JSON.stringify(REG), 415, 'text/plain'],
      ['POST', '/unregister', JSON.stringify({ instance_id: 5, model_name: 'm' }), 404],
      ['POST', '/unregister', JSON.stringify({ model_name: 'm' }), 422],
      ['POST', '/query', JSON.stringify({ token_ids: [1, 2], model_name: 'nope' }), 404],
      ['POST', '/query', JSON.stringify({ token_ids: [1, -2], model_name: 'm' }), 422],
      ['POST', '/query', JSON.stringify({ token_ids: [1, 2 ** 32], model_name: 'm' }), 422],
      ['POST', '/query', JSON.stringify({ token_ids: [1.5], model_name: 'm' }), 422],
      ['POST', '/query', JSON.stringify({ token_ids: 'abc', model_name: 'm' }), 422],
      ['POST', '/query', JSON.stringify({ token_ids: [1, '2'], model_name: 'm' }), 422],
      ['POST', '/query', JSON.stringify({ token_ids: [1, null], model_name: 'm' }), 422],
      ['POST', '/query', JSON.stringify({ token_ids: [true], model_name: 'm' }), 422],
      ['POST', '/query', JSON.stringify({ token_ids: [[1]], model_name: 'm' }), 422],
      ['POST', '/query', JSON.stringify({ model_name: 'm' }), 422],
      ['POST', '/query', JSON.stringify({ token_ids: [1], model_name: 'm', lora_name: 7 }), 422],
      ['POST', '/query_by_hash', JSON.stringify({ block_hashes: [1], model_name: 'm', cache_salt: 's' }), 400],
      ['POST', '/query_by_hash', '{"block_hashes":[9223372036854775808],"model_name":"m"}', 422],
      ['POST', '/query_by_hash', JSON.stringify({ block_hashes: [1], model_name: 'nope' }), 404],
      // A string cannot pass for a long integer, nor a long integer for a string.
      ['POST', '/register', JSON.stringify({ ...REG, instance_id: '\u0000int:abc' }), 422],
      ['POST', '/register', JSON.stringify({ ...REG, instance_id: '\u0000int:16' }), 422],
      [
        'POST',
        '/register',
        '{"instance_id":1,"endpoint":"tcp://127.0.0.1:1","model_name":12345678901234567890,"block_size":16}',
        422,
      ],
      ['POST', '/query_by_hash', '{"block_hashes":["\\u0000int:zz"],"model_name":"m"}', 422],
      // Not JSON: integers with leading zeros, however long; bytes that are not UTF-8.
      ['POST', '/register', JSON.stringify({ ...REG, instance_id: 0 }).replace('0', '00000000000000000042'), 400],
      ['POST', '/query_by_hash', '{"block_hashes":[-00000000000000001],"model_name":"m"}', 400],
      ['POST', '/register', Buffer.from('{"model_name":"\xff\xfe"}', 'latin1'), 400],
      ['POST', '/register', JSON.stringify({ ...REG, block_size: 2 ** 32 - 1 }), 400],
      ['POST', '/register', JSON.stringify({ ...REG, model_name: 'm'.repeat(1025) }), 422],
      ['POST', '/register', JSON.stringify({ ...REG, routing_group: 'g'.repeat(1025) }), 422],
      ['POST', '/register', JSON.stringify({ ...REG, endpoint: `tcp://${'h'.repeat(1025)}:1` }), 422],
      ['POST', '/register', JSON.stringify({ ...REG, url: 'not a url' }), 400],
      ['POST', '/register', JSON.stringify({ ...REG, url: 'file:///etc/passwd' }), 400],
      ['POST', '/query', Buffer.alloc(9 * 1024 * 1024, 0x20), 413],
      ['POST', '/register', Buffer.alloc(3 * 1000 * 1000, 0x20), 413],
      ['GET', '/query', '', 405],
      ['POST', '/workers', '{}', 405],
      ['GET', '/nope', '', 404],
    ];
    for (const [method, path, body, status, type] of cases) {
      const r = await raw(ix.url, method, path, body, type);
      expect([path, body.slice(0, 80).toString(), r.status], r.text).toEqual([
        path,
        body.slice(0, 80).toString(),
        status,
      ]);
      expect(r.type).toBe('application/json');
      expect(typeof JSON.parse(r.text).error).toBe('string');
    }
    // Registration conflicts, as Dynamo's indexer answers them.
    expect((await post(ix.url, '/register', REG)).status).toBe(201);
    expect(await post(ix.url, '/register', REG)).toEqual({
      status: 409,
      json: { error: 'instance 1 dp_rank 0 already registered' },
    });
    expect((await post(ix.url, '/register', { ...REG, instance_id: 2, block_size: 32 })).json).toEqual({
      error: 'block_size mismatch for model=m routing_group=default: existing=16, requested=32',
    });
    expect((await post(ix.url, '/register', { ...REG, model_name: 'other', dp_rank: 1 })).status).toBe(409);
    expect((await post(ix.url, '/unregister', { instance_id: 1, model_name: 'other' })).status).toBe(404);
    expect(
      (await post(ix.url, '/unregister', { instance_id: 1, model_name: 'm', routing_group: 'default', dp_rank: 3 }))
        .status,
    ).toBe(404);
    // Still serving: an empty query answers as Dynamo's does.
    expect(await post(ix.url, '/query', { token_ids: [], model_name: 'm' })).toEqual({
      status: 200,
      json: { scores: {}, frequencies: [], instances: {} },
    });
    expect((await post(ix.url, '/unregister', { instance_id: 1, model_name: 'm' })).status).toBe(200);
    expect((await post(ix.url, '/query', { token_ids: [1], model_name: 'm' })).status).toBe(404);
    expect((await fetch(`${ix.url}/health`)).status).toBe(200);
  });

  it('reads a query body of 8 MB in the core (390,000 i64 hashes, the extremes included) in a fraction of the time JS took', async () => {
    const ix = await indexer();
    expect((await post(ix.url, '/register', REG)).status).toBe(201);
    // 390,000 hashes of 19-20 digits, the extremes included (a 6M-token prompt).
    const hashes = Array.from({ length: 390_000 }, (_, i) =>
      i === 0 ? -(2n ** 63n) : i === 1 ? 2n ** 63n - 1n : BigInt.asIntN(64, BigInt(i) * 0x9e3779b97f4a7c15n),
    );
    const body = `{"block_hashes":[${hashes.join(',')}],"model_name":"m"}`;
    expect(body.length).toBeGreaterThan(7_500_000);
    const t0 = performance.now();
    const r = await raw(ix.url, 'POST', '/query_by_hash', body);
    const ms = performance.now() - t0;
    expect([r.status, JSON.parse(r.text)]).toEqual([200, { scores: {}, frequencies: [], instances: {} }]);
    // Read in JS (an exact-integer scan a character at a time, then an object per number): 470-560
    // ms here, the event loop held throughout. In the core: 20-60 ms.
    expect(ms).toBeLessThan(300);
    // A 700,000-token /query, the same way.
    const tokens = `{"token_ids":[${Array.from({ length: 700_000 }, (_, i) => (i * 7919) % 150_000).join(',')}],"model_name":"m"}`;
    const q = await raw(ix.url, 'POST', '/query', tokens);
    expect(q.status).toBe(200);
  });

  it('reads a body over its limit to the end before answering 413, so a client still sending it reads the answer', async () => {
    const ix = await indexer();
    // Python's http.client sends the whole body before it reads the answer: answered at the
    // limit (and the connection closed), it got a broken pipe instead of the 413.
    const script = [
      'import http.client, json, sys',
      'c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=30)',
      'body = b"{" + b" " * (int(sys.argv[2]) - 2) + b"}"',
      'try:',
      '    c.request("POST", sys.argv[3], body, {"content-type": "application/json"})',
      '    r = c.getresponse()',
      '    print(json.dumps({"status": r.status, "body": r.read().decode()}))',
      'except Exception as e:',
      '    print(json.dumps({"error": type(e).__name__}))',
    ].join('\n');
    for (const [path, size] of [
      ['/query', 9 * 1024 * 1024],
      ['/register', 3_000_000],
    ] as const) {
      const { stdout } = await execFileP('python3', ['-c', script, String(ix.port), String(size), path]);
      const out = JSON.parse(stdout);
      expect([path, out.status, out.error]).toEqual([path, 413, undefined]);
      expect(JSON.parse(out.body).error).toMatch(/request body over \d+ bytes/);
    }
  });

  it('answers requests that Node or URL refuse with a JSON 4xx, on the indexer and on a node, and keeps serving', async () => {
    const ix = await indexer();
    const publisher = await KvEventPublisher.create({ endpoint: 'tcp://127.0.0.1:*', replayEndpoint: null });
    cleanup.push(() => publisher.close());
    const node = await KvHttpServer.create({ publisher, authToken: 'secret' });
    cleanup.push(() => node.close());
    const close = 'Host: x\r\nConnection: close\r\n\r\n';
    const cases: Array<[string, number]> = [
      // Targets Node's parser takes and `URL` refuses: each once ended the process.
      [`GET //[ HTTP/1.1\r\n${close}`, 400],
      [`GET http://a:99999/health HTTP/1.1\r\n${close}`, 400],
      // Refused by Node's parser: answered by the server's own handler, not Node's bodiless one.
      ['GET /health HTTP/9.9\r\n\r\n', 400],
      ['GET /health HTTP/1.1\r\nNo colon here\r\n\r\n', 400],
      [`GET /health HTTP/1.1\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`, 431],
    ];
    for (const url of [ix.url, node.url]) {
      for (const [request, status] of cases) {
        const r = await rawHttp(url, request);
        expect([url, request.slice(0, 40), r.status]).toEqual([url, request.slice(0, 40), status]);
        expect(r.type).toBe('application/json');
        expect(typeof JSON.parse(r.body).error).toBe('string');
      }
    }
    // On a keep-alive connection, after an answer: a malformed second request is answered too.
    for (const [url, path] of [
      [ix.url, '/health'],
      [node.url, '/healthz'],
    ]) {
      const r = await rawHttp(url as string, [
        `HEAD ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\n\r\n`,
        'GET /x HTTP/9.9\r\n\r\n',
      ]);
      expect(r.status).toBe(200);
      expect(r.raw).toMatch(
        /\r\n\r\nHTTP\/1\.1 400 Bad Request\r\ncontent-type: application\/json\r\n[\s\S]*\{"error":/,
      );
    }
    expect((await fetch(`${ix.url}/health`)).status).toBe(200);
    expect((await fetch(`${node.url}/healthz`, { headers: { authorization: 'Bearer secret' } })).status).toBe(200);
  });

  it('closes connections that say nothing, on the indexer and on a node, and keeps those in use', async () => {
    const ix = await IndexerServer.create({ host: '127.0.0.1', port: 0, idleConnectionMs: 1000 });
    cleanup.push(() => ix.close());
    const publisher = await KvEventPublisher.create({ endpoint: 'tcp://127.0.0.1:*', replayEndpoint: null });
    cleanup.push(() => publisher.close());
    const node = await KvHttpServer.create({ publisher, idleConnectionMs: 1000 });
    cleanup.push(() => node.close());
    for (const url of [ix.url, node.url]) {
      const { port } = new URL(url);
      const t0 = performance.now();
      const silent = connect(Number(port), '127.0.0.1');
      cleanup.push(() => silent.destroy());
      await new Promise((resolve) => silent.on('close', resolve));
      expect(performance.now() - t0).toBeLessThan(5000);
      // A keep-alive connection that asks every 100 ms for 1.5 s is kept (the same connection
      // answers all).
      const r = await rawHttp(
        url,
        Array.from(
          { length: 16 },
          (_, i) =>
            `GET /health${url === node.url ? 'z' : ''} HTTP/1.1\r\nHost: x${i === 15 ? '\r\nConnection: close' : ''}\r\n\r\n`,
        ),
      );
      expect(r.raw.match(/HTTP\/1\.1 200/g)?.length).toBe(16);
    }
    await expect(IndexerServer.create({ host: '127.0.0.1', port: 0, idleConnectionMs: 5 })).rejects.toMatchObject({
      code: 'ERR_INVALID_ARG',
    });
  });

  it('counts a client that stops sending mid-body as a 4xx, not a server error', async () => {
    const ix = await indexer();
    for (let i = 0; i < 3; i++) {
      const { port } = new URL(ix.url);
      const socket = connect(Number(port), '127.0.0.1');
      await new Promise((r) => socket.once('connect', r));
      socket.write(
        'POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"tok',
      );
      await sleep(50);
      socket.destroy();
    }
    let metrics = '';
    for (let i = 0; i < 50 && !metrics.includes('status_class="4xx"} 3'); i++) {
      await sleep(20);
      metrics = await (await fetch(`${ix.url}/metrics`)).text();
    }
    expect(metrics).toContain('kvplane_indexer_errors_total{endpoint="/query",status_class="4xx"} 3');
    // Dynamo's families count them the same way.
    expect(metrics).toContain('dynamo_kvindexer_errors_total{endpoint="/query",status_class="4xx"} 3');
    expect(metrics).not.toMatch(/status_class="5xx"/);
  });

  it("refuses, as a 502, a node whose /healthz is not a kvplane node's", async () => {
    const ix = await indexer();
    let answer: (res: ServerResponse) => void = () => {};
    const url = await serveLocal((_req, res) => answer(res));
    const json = (body: string) => (res: ServerResponse) =>
      res.writeHead(200, { 'content-type': 'application/json' }).end(body);
    const answers: Array<[string, (res: ServerResponse) => void]> = [
      ['null', json('null')],
      ['a number for zmq', json('{"endpoints":{"zmq":5}}')],
      ['an object for replay', json('{"endpoints":{"zmq":"tcp://127.0.0.1:1","replay":{"a":1}}}')],
      ['no endpoint', json('{"endpoints":{"zmq":"garbage"}}')],
      ['a bad gRPC port', json('{"endpoints":{"grpc_port":"abc"}}')],
      ['a negative gRPC port', json('{"endpoints":{"grpc_port":-5}}')],
      ['2 MiB', json(`{"endpoints":{"zmq":"tcp://127.0.0.1:1"},"pad":"${'x'.repeat(2 << 20)}"}`)],
      ['a redirect', (res) => res.writeHead(302, { location: `${url}/elsewhere` }).end()],
    ];
    for (const [what, a] of answers) {
      answer = a;
      const r = await post(ix.url, '/register', { instance_id: 9, model_name: 'm', block_size: 16, url });
      expect([what, r.status]).toEqual([what, 502]);
      expect(typeof r.json.error).toBe('string');
    }
    expect((await fetch(`${ix.url}/workers`).then((r) => r.json())).length).toBe(0);
  });

  it('unregisters a worker followed over inproc:// (zeromq.js) at once, and keeps (model, group) pairs apart by name', async () => {
    const ix = await indexer();
    expect((await post(ix.url, '/register', { ...REG, endpoint: 'inproc://kvplane-nowhere' })).status).toBe(201);
    const t0 = performance.now();
    expect((await post(ix.url, '/unregister', { instance_id: 1, model_name: 'm' })).status).toBe(200);
    expect(performance.now() - t0).toBeLessThan(5000);
    // Names holding `:` do not share an index, and two pairs that /dump and the metrics would
    // name alike (`a:b:c`) are not both kept: the second is a 409 naming the first.
    const a = { ...REG, instance_id: 2, model_name: 'a:b', routing_group: 'c' };
    const b = { ...REG, instance_id: 3, model_name: 'a', routing_group: 'b:c', block_size: 32 };
    expect((await post(ix.url, '/register', a)).status).toBe(201);
    const refused = await post(ix.url, '/register', b);
    expect(refused.status).toBe(409);
    expect((refused.json as { error: string }).error).toContain('model=a:b routing_group=c');
    expect((await post(ix.url, '/query', { token_ids: [], model_name: 'a', routing_group: 'b:c' })).status).toBe(404);
    expect((await post(ix.url, '/query', { token_ids: [], model_name: 'a:b', routing_group: 'c' })).status).toBe(200);
    // Once the first pair is gone, the second is taken, with its own block size.
    expect((await post(ix.url, '/unregister', { instance_id: 2, model_name: 'a:b' })).status).toBe(200);
    expect((await post(ix.url, '/register', b)).status).toBe(201);
    const dump = (await fetch(`${ix.url}/dump`).then((r) => r.json())) as Record<string, { block_size: number }>;
    expect(dump['a:b:c']?.block_size).toBe(32);
  });

  it('restores a state file holding two pairs of one name with the first only, and says so', async () => {
    const stateFile = join(tmpdir(), `kvplane-ix-names-${process.pid}.json`);
    const reg = (id: number, model: string, group: string) => ({
      instance_id: String(id),
      dp_rank: 0,
      model_name: model,
      routing_group: group,
      block_size: 16,
      endpoint: 'inproc://kvplane-nowhere',
      replay_endpoint: null,
      url: null,
      engine: 'vllm',
    });
    writeFileSync(stateFile, JSON.stringify({ version: 1, registrations: [reg(2, 'a:b', 'c'), reg(3, 'a', 'b:c')] }));
    cleanup.push(() => rmSync(stateFile, { force: true }));
    const warnings: Array<[string, Record<string, unknown>]> = [];
    const ix = await IndexerServer.create({
      host: '127.0.0.1',
      port: 0,
      stateFile,
      onWarning: (msg, detail) => warnings.push([msg, detail]),
    });
    cleanup.push(() => ix.close());
    expect(warnings).toEqual([
      ['a saved registration was not restored', expect.objectContaining({ instanceId: 3n, dpRank: 0 })],
    ]);
    const workers = (await fetch(`${ix.url}/workers`).then((r) => r.json())) as Array<{ instance_id: number }>;
    expect(workers.map((w) => w.instance_id)).toEqual([2]);
    const saved = JSON.parse(readFileSync(stateFile, 'utf8')) as { registrations: Array<{ instance_id: string }> };
    expect(saved.registrations.map((r) => r.instance_id)).toEqual(['2']);
  });

  it('rejects a bad RouterIndex argument with a typed error', () => {
    expect(() => new RouterIndex({ blockSize: 0 })).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG' }));
    const r = new RouterIndex({ blockSize: 4 });
    expect(() => r.findMatches([1, -1])).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG' }));
    expect(() => r.findMatches([1, '2'] as unknown as number[])).toThrow(
      expect.objectContaining({
        code: 'ERR_INVALID_ARG',
        message: 'tokens: token at index 1 is a string, not a number',
      }),
    );
    expect(() => r.applyPayload(1n, Buffer.from([0xc1]), 'vllm')).toThrow(
      expect.objectContaining({ code: 'ERR_DECODE' }),
    );
    expect(() => r.applyPayload(-1n, Buffer.from([0x90]), 'vllm')).toThrow(
      expect.objectContaining({ code: 'ERR_INVALID_ARG' }),
    );
  });
});

describe('kvplane indexer: a kvplane node registered by URL', () => {
  /** A kvplane node on loopback (block size 4): its publisher, gRPC and HTTP servers. */
  async function kvNode(authToken?: string) {
    const publisher = await KvEventPublisher.create({ endpoint: 'tcp://127.0.0.1:*', blockSize: 4 });
    const grpc = await KvGrpcServer.create({ stream: publisher.stream, host: '127.0.0.1', port: 0, authToken });
    const http = await KvHttpServer.create({ publisher, port: 0, grpc, authToken });
    cleanup.push(async () => {
      await http.close();
      await grpc.close();
      await publisher.close();
    });
    return { publisher, grpc, http };
  }

  /** A node holding one block (`hash`, tokens 1-4), published and flushed. */
  async function kvNodeHolding(hash: bigint) {
    const node = await kvNode();
    node.publisher.publish([
      {
        type: 'stored',
        blockHashes: [hash],
        parentBlockHash: null,
        tokenIds: Uint32Array.of(1, 2, 3, 4),
        blockSize: 4,
      },
    ]);
    await node.publisher.flush();
    return node;
  }

  it('follows nodes started with a bearer token when given it: discovery, gRPC, and /kv_recover for a ZMQ worker', async () => {
    const token = 'node-secret';
    const { publisher, http } = await kvNode(token);
    const tokens = Uint32Array.from({ length: 8 }, (_, i) => i + 1);
    publisher.publish([
      { type: 'stored', blockHashes: [21n, 22n], parentBlockHash: null, tokenIds: tokens, blockSize: 4 },
    ]);
    await publisher.flush();
    const url = `http://127.0.0.1:${http.port}`;
    const reg = { instance_id: 1, url, model_name: 'm', block_size: 4 };
    // Without the token the node refuses the indexer's /healthz read.
    const plain = await indexer();
    const refused = await post(plain.url, '/register', reg);
    expect([refused.status, refused.json.error]).toEqual([502, `cannot read ${url}/healthz: HTTP 401`]);
    const ix = await IndexerServer.create({ host: '127.0.0.1', port: 0, nodeToken: token });
    cleanup.push(() => ix.close());
    // A registration names where the token goes: only a holder of it may register.
    const anyone = await post(ix.url, '/register', { ...reg, url: 'http://127.0.0.1:9' });
    expect([anyone.status, anyone.json.error]).toEqual([
      401,
      '/register needs the node token (Authorization: Bearer <token>)',
    ]);
    expect((await post(ix.url, '/unregister', { instance_id: 1, model_name: 'm' })).status).toBe(401);
    // Nor name the peers a restart loads its index from.
    for (const route of ['/register_peer', '/deregister_peer'])
      expect((await post(ix.url, route, { url: 'http://127.0.0.1:9' })).status).toBe(401);
    expect(
      (await post(ix.url, '/register_peer', { url: 'http://127.0.0.1:9' }, { authorization: `Bearer ${token}` }))
        .status,
    ).toBe(201);
    expect(ix.peers.list()).toEqual(['http://127.0.0.1:9']);
    // By URL: its gRPC stream, snapshot first. By its ZMQ endpoint with its URL: the blocks
    // published before it joined come from the node's /kv_recover tree dump.
    const bearer = { authorization: `Bearer ${token}` };
    expect((await post(ix.url, '/register', reg, bearer)).status).toBe(201);
    const zmq = { instance_id: 2, endpoint: publisher.endpoint, url, model_name: 'm', block_size: 4 };
    expect((await post(ix.url, '/register', zmq, bearer)).status).toBe(201);
    // The ZMQ worker learns where the stream is from the batches that follow (an engine keeps
    // publishing; here, removals of a block nobody holds), and loads what came before.
    const query = { token_ids: [...tokens], model_name: 'm' };
    const want = JSON.stringify({ '1': { '0': 8 }, '2': { '0': 8 } });
    for (let i = 0; i < 150 && JSON.stringify((await post(ix.url, '/query', query)).json.scores) !== want; i++) {
      publisher.publish([{ type: 'removed', blockHashes: [999n] }]);
      await sleep(20);
    }
    expect(JSON.stringify((await post(ix.url, '/query', query)).json.scores)).toBe(want);
    const index = ix.registry.index('m', 'default');
    expect(index.subscription(1n)?.stats().recoveries.snapshot).toBe(1);
    expect(index.subscription(2n)?.stats().lastError).toBeNull();
  });

  it("does not follow a redirect from a node's /kv_recover to another place", async () => {
    const { publisher, http } = await kvNodeHolding(21n);
    let stolen = 0;
    const elsewhereUrl = await serveLocal((_req, res) => {
      stolen++;
      res.end('{}');
    });
    // The node's own /healthz, and a /kv_recover that sends the indexer somewhere else.
    const url = await serveLocal(async (req, res) => {
      if (req.url?.startsWith('/kv_recover')) {
        res.writeHead(302, { location: `${elsewhereUrl}/steal` });
        return void res.end();
      }
      const health = await fetch(`http://127.0.0.1:${http.port}/healthz`);
      res.writeHead(health.status, { 'content-type': 'application/json' });
      res.end(await health.text());
    });
    const ix = await indexer();
    const reg = { instance_id: 2, endpoint: publisher.endpoint, url, model_name: 'm', block_size: 4 };
    expect((await post(ix.url, '/register', reg)).status).toBe(201);
    const sub = () => ix.registry.index('m', 'default').subscription(2n)?.stats();
    for (let i = 0; i < 150 && !/kv_recover/.test(sub()?.lastError ?? ''); i++) {
      publisher.publish([{ type: 'removed', blockHashes: [999n] }]);
      await sleep(20);
    }
    expect(sub()?.lastError).toMatch(
      /\/kv_recover: HTTP 302: a redirect to "http:\/\/127\.0\.0\.1:\d+\/steal", not followed$/,
    );
    expect(stolen).toBe(0);
  });

  it("loads a node's state again after a failed load (the worker was cleared), 10 s later", async () => {
    const { publisher, http } = await kvNodeHolding(41n);
    // The node's own answers, its /kv_recover failing until `failing` is unset.
    let failing = true;
    const url = await serveLocal(async (req, res) => {
      if (failing && req.url?.startsWith('/kv_recover')) {
        res.writeHead(500);
        return void res.end();
      }
      const own = await fetch(`http://127.0.0.1:${http.port}${req.url}`);
      res.writeHead(own.status, { 'content-type': own.headers.get('content-type') ?? 'application/json' });
      res.end(Buffer.from(await own.arrayBuffer()));
    });
    const ix = await indexer();
    const reg = { instance_id: 5, endpoint: publisher.endpoint, url, model_name: 'm', block_size: 4 };
    expect((await post(ix.url, '/register', reg)).status).toBe(201);
    const sub = () => ix.registry.index('m', 'default').subscription(5n)?.stats();
    for (let i = 0; i < 150 && !/kv_recover: HTTP 500/.test(sub()?.lastError ?? ''); i++) {
      publisher.publish([{ type: 'removed', blockHashes: [999n] }]);
      await sleep(20);
    }
    expect(sub()?.lastError).toMatch(/^loading the state failed: .*\/kv_recover: HTTP 500$/);
    const query = { token_ids: [1, 2, 3, 4], model_name: 'm' };
    expect((await post(ix.url, '/query', query)).json.scores).toEqual({});
    // The node answers again: before, the worker stayed without the node's block for good.
    failing = false;
    const t0 = Date.now();
    let scores: unknown = {};
    while (Date.now() - t0 < 15_000 && JSON.stringify(scores) !== '{"5":{"0":4}}') {
      await sleep(200);
      scores = (await post(ix.url, '/query', query)).json.scores;
    }
    expect(scores).toEqual({ '5': { '0': 4 } });
    expect(sub()?.recoveries.snapshot).toBeGreaterThanOrEqual(1);
  }, 30_000);

  it("says so when a node's /kv_recover dump claims a seq far ahead of its live stream (loaded, then cleared)", async () => {
    const { publisher, http } = await kvNodeHolding(31n);
    // The node's own dump, its last_seq moved 2^40 ahead: not a seq this stream will reach.
    const url = await serveLocal(async (req, res) => {
      const own = await fetch(`http://127.0.0.1:${http.port}${req.url}`);
      let body = Buffer.from(await own.arrayBuffer());
      if (req.url?.startsWith('/kv_recover')) {
        const dump = msgpackDecode(body, { useBigInt64: true }) as { TreeDump: { last_seq: bigint | number } };
        dump.TreeDump.last_seq = BigInt(dump.TreeDump.last_seq) + 2n ** 40n;
        body = Buffer.from(msgpackEncode(dump, { useBigInt64: true }));
      }
      res.writeHead(own.status, { 'content-type': own.headers.get('content-type') ?? 'application/json' });
      res.end(body);
    });
    const ix = await indexer();
    const reg = { instance_id: 3, endpoint: publisher.endpoint, url, model_name: 'm', block_size: 4 };
    expect((await post(ix.url, '/register', reg)).status).toBe(201);
    const sub = () => ix.registry.index('m', 'default').subscription(3n)?.stats();
    for (let i = 0; i < 150 && !/loaded state refused/.test(sub()?.lastError ?? ''); i++) {
      publisher.publish([{ type: 'removed', blockHashes: [999n] }]);
      await sleep(20);
    }
    expect(sub()?.lastError).toMatch(/^loaded state refused: its seq \d+ is further ahead of the live stream/);
    // The dump's blocks went with the clear that followed the refusal.
    publisher.publish([{ type: 'removed', blockHashes: [999n] }]);
    await until(() => (sub()?.recoveries.cleared ?? 0) >= 1, 'the rank cleared');
    await sleep(100);
    const query = { token_ids: [1, 2, 3, 4], model_name: 'm' };
    expect((await post(ix.url, '/query', query)).json.scores).toEqual({});
  });

  it('reads at most two /kv_recover tree dumps at once across its workers; an unregistered one stops waiting', async () => {
    const { publisher, http } = await kvNodeHolding(41n);
    // The node's own answers, each /kv_recover held 1.5 s: how many are read at once.
    let reading = 0;
    let most = 0;
    let dumps = 0;
    const url = await serveLocal(async (req, res) => {
      const isDump = req.url?.startsWith('/kv_recover') ?? false;
      if (isDump) {
        most = Math.max(most, ++reading);
        dumps++;
        await sleep(1500);
      }
      const own = await fetch(`http://127.0.0.1:${http.port}${req.url}`);
      res.writeHead(own.status, { 'content-type': own.headers.get('content-type') ?? 'application/json' });
      res.end(Buffer.from(await own.arrayBuffer()));
      if (isDump) reading--;
    });
    const ix = await indexer();
    // Six workers on the one node (as six models would be), each joining by a tree dump.
    for (let id = 1; id <= 6; id++) {
      const reg = { instance_id: id, endpoint: publisher.endpoint, url, model_name: `m${id}`, block_size: 4 };
      expect((await post(ix.url, '/register', reg)).status).toBe(201);
    }
    const snapshots = () =>
      [1, 2, 3, 4, 5].map(
        (id) => ix.registry.index(`m${id}`, 'default').subscription(BigInt(id))?.stats().recoveries.snapshot ?? 0,
      );
    for (let i = 0; i < 200 && dumps < 2; i++) {
      publisher.publish([{ type: 'removed', blockHashes: [999n] }]);
      await sleep(20);
    }
    // One that waits its turn is unregistered at once, not after the dumps before it.
    const t0 = performance.now();
    expect((await post(ix.url, '/unregister', { instance_id: 6, model_name: 'm6' })).status).toBe(200);
    expect(performance.now() - t0).toBeLessThan(800);
    // A worker joins (and reads its dump) at the first live batch it sees: one connected late
    // needs batches after the others' too.
    for (let i = 0; i < 500 && !snapshots().every((n) => n >= 1); i++) {
      publisher.publish([{ type: 'removed', blockHashes: [999n] }]);
      await sleep(30);
    }
    expect(snapshots().every((n) => n >= 1)).toBe(true);
    expect(most).toBe(2);
    expect(dumps).toBeLessThanOrEqual(6);
    const query = { token_ids: [1, 2, 3, 4], model_name: 'm3' };
    expect((await post(ix.url, '/query', query)).json.scores).toEqual({ '3': { '0': 4 } });
  }, 30_000);

  it('finds its gRPC server from /healthz, rebuilds from its snapshot, and survives an indexer restart from the state file', async () => {
    const { publisher, grpc, http } = await kvNode();
    const tokens = Uint32Array.from({ length: 12 }, (_, i) => i + 1);
    publisher.publish([
      { type: 'stored', blockHashes: [11n, 12n, 13n], parentBlockHash: null, tokenIds: tokens, blockSize: 4 },
    ]);
    await publisher.flush();
    const stateFile = join(tmpdir(), `kvplane-ix-${process.pid}.json`);
    let ix = await IndexerServer.create({ host: '127.0.0.1', port: 0, stateFile });
    const reg = { instance_id: 42, url: `http://127.0.0.1:${http.port}`, model_name: 'm', block_size: 4 };
    expect((await post(ix.url, '/register', reg)).status).toBe(201);
    const want = {
      scores: { '42': { '0': 12 } },
      frequencies: [],
      instances: { '42': { longest_matched: 12, gpu: 12, dp: { '0': 12 }, cpu: 12, disk: 12 } },
    };
    const query = { token_ids: [...tokens, 99], model_name: 'm' };
    for (let i = 0; i < 100 && (await post(ix.url, '/query', query)).json.scores['42'] === undefined; i++)
      await sleep(20);
    expect((await post(ix.url, '/query', query)).json).toEqual(want);
    // biome-ignore lint/suspicious/noExplicitAny: JSON answers, read field by field
    const workers = (await (await fetch(`${ix.url}/workers`)).json()) as any[];
    expect(workers[0]).toMatchObject({ instance_id: 42, source: 'grpc', status: 'active', block_size: 4 });
    expect(workers[0].endpoints['0']).toBe(`grpc://127.0.0.1:${grpc.port}`);
    await ix.close();
    ix = await IndexerServer.create({ host: '127.0.0.1', port: 0, stateFile });
    cleanup.push(() => ix.close());
    const index = ix.registry.index('m', 'default');
    await until(() => index.subscription(42n)?.stats().state === 'live', 'the restarted indexer following the node');
    await until(() => index.findMatches(tokens).workerIds.length === 1, 'the snapshot applied');
    expect((await post(ix.url, '/query', query)).json).toEqual(want);
    expect(index.subscription(42n)?.stats().recoveries.snapshot).toBe(1);
    const metrics = await (await fetch(`${ix.url}/metrics`)).text();
    expect(metrics).toMatch(
      /kvplane_indexer_worker_recoveries_total\{instance_id="42",dp_rank="0",kind="snapshot"\} 1/,
    );
    expect(metrics).toMatch(/kvplane_indexer_workers 1/);
  });
});
