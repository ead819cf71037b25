import { type ClientReadableStream, credentials, makeGenericClientConstructor, status } from '@grpc/grpc-js';
import { afterEach, describe, expect, it } from 'vitest';
import { Dealer } from 'zeromq';
import {
  decodeBatch,
  encodeSubscribeRequest,
  type KvEvent,
  KvEventPublisher,
  KvGrpcServer,
  KvHttpServer,
  subscribeDefinition,
} from '../src/index.js';
import { runGrpcPeer } from './fixtures.js';

const LOOPBACK = 'tcp://127.0.0.1:*';
const END = Buffer.alloc(8, 0xff);
const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

/** An engine node with its defaults (clock-based first seq, opening clear) on all three transports. */
async function node() {
  const pub = await KvEventPublisher.create({ endpoint: LOOPBACK, replayEndpoint: LOOPBACK });
  const grpc = await KvGrpcServer.create({ stream: pub.stream, host: '127.0.0.1' });
  const http = await KvHttpServer.create({ publisher: pub });
  const close = async () => {
    await grpc.close();
    await http.close();
    await pub.close();
  };
  cleanup.push(close);
  return { pub, grpc, http, close };
}

function stored(n: number): KvEvent[] {
  return [
    {
      type: 'stored',
      blockHashes: [BigInt(n)],
      parentBlockHash: null,
      tokenIds: new Uint32Array(16).fill(n),
      blockSize: 16,
    },
  ];
}

/** Subscribes from `start`; resolves with the first batch's seq or the call's error. */
function grpcFirst(port: number, start: bigint): Promise<{ seq?: bigint; code?: number; details?: string }> {
  const Client = makeGenericClientConstructor(subscribeDefinition('vllm.grpc.engine.VllmEngine'), 'kv');
  const client = new Client(`127.0.0.1:${port}`, credentials.createInsecure());
  cleanup.push(() => client.close());
  const call = (client as unknown as Record<string, (r: Buffer) => ClientReadableStream<Buffer>>).SubscribeKvEvents?.(
    encodeSubscribeRequest(start),
  ) as ClientReadableStream<Buffer>;
  return new Promise((resolve) => {
    call.on('data', (b: Buffer) => {
      resolve({ seq: decodeBatch(b, 'smg_proto').seq });
      call.cancel();
    });
    call.on('error', (e: { code: number; details: string }) => resolve({ code: e.code, details: e.details }));
  });
}

describe('a restarted node never serves its old cursors', () => {
  it('opens above every old seq with a clear; gRPC, ZMQ replay and /kv_recover treat an old cursor as expired', async () => {
    const before = BigInt(Date.now()) * 1000n;
    const a = await node();
    for (let i = 1; i <= 10; i++) {
      a.pub.publish(stored(i));
      await a.pub.flush();
    }
    const lastA = a.pub.indexer.lastSeq;
    const first = a.pub.indexer.replay(0n, 1);
    const firstSeqA = first.seqs[0] as bigint;
    // The first seq comes from the clock; the first batch clears the rank.
    expect(firstSeqA).toBeGreaterThanOrEqual(before);
    expect(decodeBatch(first.payloads[0] as Buffer, 'vllm').events).toEqual([{ type: 'cleared' }]);
    expect(lastA).toBe(firstSeqA + 10n);
    await a.close();

    // The next incarnation.
    const b = await node();
    b.pub.publish(stored(100));
    await b.pub.flush();
    const firstSeqB = b.pub.indexer.replay(0n, 1).seqs[0] as bigint;
    expect(firstSeqB).toBeGreaterThan(lastA);
    const resume = lastA + 1n; // what a consumer of A asks for next

    // gRPC: OUT_OF_RANGE with the expired-cursor text, so SMG clears and resubscribes from 0.
    const g = await grpcFirst(b.grpc.port, resume);
    expect(g.code).toBe(status.OUT_OF_RANGE);
    expect(g.details).toMatch(/expired KV event replay cursor: requested sequence/);
    expect(b.grpc.stats().subscribes.expired).toBeGreaterThanOrEqual(1);
    // The same through grpcio with SMG's own stubs (smg-grpc-proto): the status SMG clears on,
    // and from the new first seq the opening clear.
    const address = `127.0.0.1:${b.grpc.port}`;
    expect((await runGrpcPeer([address, 'vllm', String(resume), '1'])).at(-1)).toMatchObject({
      status: 'OUT_OF_RANGE',
      details: expect.stringMatching(/expired KV event replay cursor/),
    });
    const fromFirst = await runGrpcPeer([address, 'vllm', String(firstSeqB), '1']);
    expect(fromFirst.at(-1)).toMatchObject({ seq: String(firstSeqB), events: [{ type: 'cleared' }] });
    // A fresh subscription from 0 starts with the new incarnation's state, as a snapshot taken
    // at its last seq (the clear and one batch since): nothing of the old one.
    const fresh = grpcFirst(b.grpc.port, 0n);
    expect((await fresh).seq).toBe(firstSeqB + 1n);

    // ZMQ replay: the first reply is not the seq asked for (the client compares), and it is the clear.
    const d = new Dealer({ receiveTimeout: 5000, linger: 0 });
    cleanup.push(() => d.close());
    d.connect(b.pub.replayEndpoint as string);
    const start = Buffer.alloc(8);
    start.writeBigUInt64BE(resume);
    await d.send([Buffer.alloc(0), start]);
    const [, , seqFrame, payload] = (await d.receive()) as Buffer[];
    expect(seqFrame?.readBigUInt64BE()).toBe(firstSeqB);
    expect(seqFrame?.readBigUInt64BE()).not.toBe(resume);
    expect(decodeBatch(payload as Buffer, 'vllm').events).toEqual([{ type: 'cleared' }]);
    let last = seqFrame as Buffer;
    while (!last.equals(END)) last = ((await d.receive()) as Buffer[])[2] as Buffer;

    // /kv_recover: a TreeDump, never Events of the new incarnation under the old numbers.
    const r = await fetch(`${b.http.url}/kv_recover?start=${resume}`);
    expect(r.status).toBe(200);
    const answer = JSON.parse(await r.text()) as Record<string, unknown>;
    expect(Object.keys(answer)).toEqual(['TreeDump']);
  });
});
