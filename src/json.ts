/** JSON with bigints (u64 ids, hashes, seqs) written as exact integers. */
export function jsonExact(value: unknown): string {
  return JSON.stringify(value, (_k, v) => (typeof v === 'bigint' ? `${BIGINT}${v}` : v)).replace(BIGINT_RE, '$1');
}

/** Marks a bigint in `JSON.stringify`'s output until it is written bare. */
const BIGINT = '\u0000bigint:';
const BIGINT_RE = /"\\u0000bigint:(-?\d+)"/g;
