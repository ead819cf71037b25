import { bodyUpTo } from './body.js';

/**
 * GETs `path` from a kvplane node at `url`, as a router reads one (its `/healthz`, its
 * `/kv_recover`): within `timeoutMs`, with the node's bearer `token` if it has one, following no
 * redirect (a node's own answers are at its own URL), and refusing a body over `limit` bytes as
 * it arrives, never read whole first. A status other than 2xx is an error. `signal`: give up.
 */
export async function nodeGet(
  url: string | URL,
  path: string,
  o: {
    token?: string | null;
    limit: number;
    timeoutMs: number;
    /** Also within this long for the answer to begin (one that cannot be reached is given up soon). */
    firstByteMs?: number;
    signal?: AbortSignal;
  },
): Promise<Buffer> {
  let res: Response;
  const timeout = AbortSignal.timeout(o.timeoutMs);
  const begun = new AbortController();
  const firstByte =
    o.firstByteMs === undefined
      ? null
      : setTimeout(() => begun.abort(new Error(`no answer within ${o.firstByteMs} ms`)), o.firstByteMs);
  try {
    res = await fetch(new URL(path, url), {
      signal: AbortSignal.any([timeout, begun.signal, ...(o.signal ? [o.signal] : [])]),
      redirect: 'manual',
      headers: o.token ? { authorization: `Bearer ${o.token}` } : {},
    });
  } catch (err) {
    if (begun.signal.aborted) throw begun.signal.reason;
    // fetch says only "fetch failed"; what failed (ECONNREFUSED, ...) is its cause.
    const cause = (err as Error).cause as { code?: string; message?: string } | undefined;
    const why = cause?.code ?? cause?.message;
    throw new Error(why ? `${(err as Error).message} (${why})` : (err as Error).message);
  } finally {
    if (firstByte !== null) clearTimeout(firstByte);
  }
  if (res.status >= 300 && res.status < 400) {
    await res.body?.cancel();
    const to = (res.headers.get('location') ?? '').slice(0, 256);
    throw new Error(`HTTP ${res.status}: a redirect${to ? ` to ${JSON.stringify(to)}` : ''}, not followed`);
  }
  if (!res.ok) {
    await res.body?.cancel();
    throw new Error(`HTTP ${res.status}`);
  }
  return bodyUpTo(res, o.limit);
}
