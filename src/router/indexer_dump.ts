import type * as Native from '../../index.js';
import { callNative } from '../errors.js';
import native from '../native.js';

/**
 * One index of an indexer's `GET /dump` (kvplane's or Dynamo's), read natively: its name
 * (`model_name:routing_group`), block size and how many stored events it holds; its blocks stay
 * native until `RouterIndex.restore` stores them (and takes them: a dumped index is restored once).
 */
export type DumpedIndex = Native.NativeDumpedIndex;

/** Reads a `/dump` body: `ERR_DECODE` when it is not one. */
export function readIndexerDump(body: Uint8Array): DumpedIndex[] {
  const bytes = Buffer.isBuffer(body) ? body : Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  return callNative(() => native.parseDynamoDump(bytes));
}
