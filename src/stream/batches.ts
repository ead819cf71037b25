import type * as Native from '../../index.js';
import type { EncodeFormat } from '../codec.js';

/** Batches one drain cycle published, in seq order, in one format: `payloads[i]` is batch `seqs[i]`. */
export interface EncodedBatches {
  seqs: BigUint64Array;
  payloads: Buffer[];
}

/** Receives every drain's batches in the format it consumes. */
export type BatchConsumer = (batches: EncodedBatches) => void;

/**
 * One drain's batches in `format`, or `undefined` when the drain did not encode that format. The
 * only place that knows the shape of a drain's output: one entry per format, the log's first.
 */
export function batchesIn(out: Native.PublishedOut, format: EncodeFormat): EncodedBatches | undefined {
  const encoding = out.encodings.find((e) => e.format === format);
  return encoding && { seqs: out.seqs, payloads: encoding.payloads };
}
