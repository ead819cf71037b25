/** An answer's body, refused once it is over `limit` bytes (read as it arrives, never whole first). */
export async function bodyUpTo(res: Response, limit: number): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  const reader = res.body?.getReader();
  for (;;) {
    const next = await reader?.read();
    if (next === undefined || next.done) break;
    size += next.value.length;
    if (size > limit) {
      await reader?.cancel();
      throw new Error(`answer over ${limit} bytes`);
    }
    chunks.push(next.value);
  }
  return Buffer.concat(chunks);
}
