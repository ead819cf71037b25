/** An HTTP answer's body grew past what its reader takes. */
export class BodyTooLargeError extends Error {
  constructor(readonly limit: number) {
    super(`answer over ${limit} bytes`);
  }
}

/** `res`'s body, refused (`BodyTooLargeError`) as it arrives once past `limit` bytes. */
export async function bodyUpTo(res: Response, limit: number): Promise<Buffer> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  const reader = res.body?.getReader();
  for (;;) {
    const next = await reader?.read();
    if (next === undefined || next.done) break;
    size += next.value.length;
    if (size > limit) {
      await reader?.cancel();
      throw new BodyTooLargeError(limit);
    }
    chunks.push(next.value);
  }
  return Buffer.concat(chunks);
}
