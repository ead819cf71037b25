/** An HTTP answer's body grew past what its reader takes. */
export class BodyTooLargeError extends Error {
  constructor(readonly limit: number) {
    super(`answer over ${limit} bytes`);
  }
}

/**
 * `res`'s body, refused (`BodyTooLargeError`) as it arrives once past `limit` bytes. One whose
 * length is announced is read into one buffer of that length (a dump as large as an index is not
 * held twice, its chunks and their join).
 */
export async function bodyUpTo(res: Response, limit: number): Promise<Buffer> {
  const announced = Number(res.headers.get('content-length') ?? Number.NaN);
  const whole = Number.isSafeInteger(announced) && announced <= limit ? Buffer.allocUnsafe(announced) : null;
  const chunks: Uint8Array[] = [];
  let size = 0;
  const reader = res.body?.getReader();
  for (;;) {
    const next = await reader?.read();
    if (next === undefined || next.done) break;
    if (size + next.value.length > (whole?.length ?? limit)) {
      await reader?.cancel();
      throw new BodyTooLargeError(whole?.length ?? limit);
    }
    if (whole) whole.set(next.value, size);
    else chunks.push(next.value);
    size += next.value.length;
  }
  return whole ? whole.subarray(0, size) : Buffer.concat(chunks);
}
