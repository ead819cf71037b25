import { type ClientReadableStream, credentials, type Metadata, makeGenericClientConstructor } from '@grpc/grpc-js';
import { describe, expect, it } from 'vitest';
import {
  decodeBatch,
  type EncodedBatches,
  encodeSubscribeRequest,
  KvEventStream,
  KvGrpcServer,
  subscribeDefinition,
} from '../src/index.js';
import { FROM_SEQ_1 } from './fixtures.js';

async function until(cond: () => boolean): Promise<void> {
  for (let i = 0; i < 400 && !cond(); i++) await new Promise((r) => setTimeout(r, 10));
  expect(cond()).toBe(true);
}

const BS = 4;

function stored(first: number, n: number, parent?: bigint) {
  const hashes = Array.from({ length: n }, (_, i) => BigInt(first + i));
  return {
    type: 'stored' as const,
    blockHashes: hashes,
    parentBlockHash: parent,
    tokenIds: Uint32Array.from({ length: n * BS }, (_, i) => first * 100 + i),
    blockSize: BS,
  };
}

describe('KvEventStream', () => {
  it('hands each consumer the same batches in its own format, encoded once per format, in seq order', async () => {
    const s = new KvEventStream({ blockSize: BS, ...FROM_SEQ_1 });
    const vllm: EncodedBatches[] = [];
    const proto: EncodedBatches[] = [];
    s.consume('vllm', (b) => vllm.push(b));
    const stopProto = s.consume('smg_proto', (b) => proto.push(b));
    s.publish([stored(1, 2)]);
    await s.flush();
    s.publish([stored(3, 1, 2n), { type: 'removed', blockHashes: [3n] }]);
    await s.flush();
    const seqs = (bs: EncodedBatches[]) => bs.flatMap((b) => [...b.seqs]);
    expect(seqs(vllm)).toEqual([1n, 2n]);
    expect(seqs(proto)).toEqual([1n, 2n]);
    for (const [i, b] of vllm.entries()) {
      const fromProto = decodeBatch(proto[i]?.payloads[0] as Buffer, 'smg_proto');
      expect(fromProto.seq).toBe(b.seqs[0]);
      expect(fromProto.events).toEqual(decodeBatch(b.payloads[0] as Buffer, 'vllm').events);
    }
    // With its last consumer gone a format is no longer delivered; the log format still is.
    stopProto();
    s.publish([{ type: 'cleared' }]);
    await s.flush();
    expect(seqs(proto)).toEqual([1n, 2n]);
    expect(seqs(vllm)).toEqual([1n, 2n, 3n]);
    // Subscribing again turns the format back on for the batches that follow.
    const again: EncodedBatches[] = [];
    s.consume('smg_proto', (b) => again.push(b));
    s.publish([stored(9, 1)]);
    await s.flush();
    expect(seqs(again)).toEqual([4n]);
    expect(decodeBatch(again[0]?.payloads[0] as Buffer, 'smg_proto').events[0]).toMatchObject({ type: 'stored' });
    expect(s.stats()).toMatchObject({ events: 5, batches: 4, lastSeq: 4n, queueFull: 0, gaps: 0 });
    await s.close();
  });

  it('turns queue overflow into a counted drop and a seq gap its consumers see', async () => {
    const s = new KvEventStream({ blockSize: BS, maxQueueSize: 4, ...FROM_SEQ_1 });
    const got: bigint[] = [];
    s.consume(s.logFormat, (b) => got.push(...b.seqs));
    s.publish([stored(1, 1)]);
    await s.flush();
    const accepted = s.publish(Array.from({ length: 10 }, (_, i) => stored(10 + i, 1)));
    expect(accepted).toBe(4);
    await s.flush();
    s.publish([{ type: 'cleared' }]);
    await s.flush();
    const st = s.stats();
    expect(st.queueFull).toBe(6);
    expect(st.gaps).toBe(1);
    // The drop took a seq: consumers see a hole, never a silent loss.
    expect(got.length).toBeLessThan(Number(st.lastSeq));
    expect(got[got.length - 1]).toBe(st.lastSeq);
    await s.close();
  });

  it('runs close hooks after its last batch and before the index closes, then refuses work with ERR_CLOSED', async () => {
    const s = new KvEventStream({ blockSize: BS, ...FROM_SEQ_1 });
    const got: bigint[] = [];
    s.consume('vllm', (b) => got.push(...b.seqs));
    let seenAtClose: bigint | undefined;
    s.onClose(() => {
      seenAtClose = s.indexer.lastSeq;
    });
    s.publish([stored(1, 1)]);
    await s.close();
    expect(got).toEqual([1n]);
    expect(seenAtClose).toBe(1n);
    expect(s.closed).toBe(true);
    expect(() => s.cleared()).toThrow(expect.objectContaining({ code: 'ERR_CLOSED' }));
    expect(() => s.consume('vllm', () => {})).toThrow(expect.objectContaining({ code: 'ERR_CLOSED' }));
  });

  it('serves a bare stream (no ZMQ) to a gRPC subscriber on loopback: replay from seq 1, then live', async () => {
    const s = new KvEventStream({ blockSize: BS, ...FROM_SEQ_1 });
    const log: Buffer[] = [];
    s.consume('vllm', (b) => log.push(...b.payloads));
    s.publish([stored(1, 2)]);
    await s.flush();
    const grpc = await KvGrpcServer.create({ stream: s, host: '127.0.0.1' });
    const Client = makeGenericClientConstructor(subscribeDefinition('vllm.grpc.engine.VllmEngine'), 'kv');
    const client = new Client(`127.0.0.1:${grpc.port}`, credentials.createInsecure());
    const got: Buffer[] = [];
    const call = (
      client as unknown as Record<string, (r: Buffer, m?: Metadata) => ClientReadableStream<Buffer>>
    ).SubscribeKvEvents?.(encodeSubscribeRequest(1n)) as ClientReadableStream<Buffer>;
    call.on('data', (b: Buffer) => got.push(b));
    call.on('error', () => {});
    try {
      await until(() => got.length === 1);
      s.publish([stored(50, 1)]);
      await s.flush();
      await until(() => got.length === 2);
      const batches = got.map((b) => decodeBatch(b, 'smg_proto'));
      expect(batches.map((b) => b.seq)).toEqual([1n, 2n]);
      expect(batches[1]?.events).toEqual(decodeBatch(log[1] as Buffer, 'vllm').events);
      expect(grpc.stats().subscribes.replay).toBe(1);
    } finally {
      call.cancel();
      client.close();
      await grpc.close();
      await s.close();
    }
  });
});
