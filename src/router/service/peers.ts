import { nodeGet } from '../../transports/http/node_get.js';
import { trimMemorySoon } from '../../transports/memory.js';
import { readIndexerDump } from '../indexer_dump.js';
import { HttpError } from './json.js';
import type { Registry } from './registry.js';

/** How long a peer has to begin its `/dump` answer (one that cannot be reached is passed over soon). */
const DUMP_HEADERS_MS = 5_000;
/** How long it has to send it whole. */
const DUMP_TIMEOUT_MS = 60_000;
/** The largest `/dump` body read from a peer. */
const DUMP_BYTES = 2 ** 31 - 1;

/**
 * Peer indexers (Dynamo's P2P recovery): other indexers following the same workers, whose
 * `/dump` a starting indexer loads before it serves. The list only matters at a start: peers
 * do not exchange anything while both run.
 */
export class Peers {
  readonly #urls: string[] = [];
  /** Called after every change (the state file is written from it). */
  onChange: (() => void) | null = null;

  list(): string[] {
    return [...this.#urls];
  }

  /** Adds a peer by its base URL (`http://host:port`); one already listed is left as it is. */
  add(url: string): void {
    checkPeerUrl(url);
    if (this.#urls.includes(url)) return;
    this.#urls.push(url);
    this.onChange?.();
  }

  /** False when `url` is not listed. */
  remove(url: string): boolean {
    const at = this.#urls.indexOf(url);
    if (at < 0) return false;
    this.#urls.splice(at, 1);
    this.onChange?.();
    return true;
  }
}

/** An `http://` or `https://` URL with no query or fragment: a 400 says what is wrong. */
export function checkPeerUrl(url: string): void {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw new HttpError(400, `peer url ${JSON.stringify(url)} is not a URL`);
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:')
    throw new HttpError(400, `peer url ${JSON.stringify(url)}: http:// or https://`);
  if (u.search !== '' || u.hash !== '')
    throw new HttpError(400, `peer url ${JSON.stringify(url)} has a query or fragment`);
}

/** What a start from a peer loaded. */
export interface PeerRecovery {
  peer: string;
  indexes: Array<{ name: string; segments: number; blocks: number; skipped: number }>;
}

/**
 * Loads the `/dump` of the first peer that answers one into the registry's indexes (an index
 * the registry lacks is made with the dump's block size); `null` when none did. Each peer's
 * failure is passed to `onWarning`.
 */
export async function recoverFromPeers(
  peers: readonly string[],
  registry: Registry,
  onWarning?: (msg: string, detail: Record<string, unknown>) => void,
): Promise<PeerRecovery | null> {
  for (const peer of peers) {
    let body: Buffer;
    try {
      body = await fetchDump(peer);
    } catch (err) {
      onWarning?.('recovery from a peer failed, trying the next', { peer, error: (err as Error).message });
      continue;
    }
    let dumped: ReturnType<typeof readIndexerDump>;
    try {
      dumped = readIndexerDump(body);
    } catch (err) {
      onWarning?.('a peer answered /dump with something else, trying the next', {
        peer,
        error: (err as Error).message,
      });
      continue;
    }
    const out: PeerRecovery = { peer, indexes: [] };
    // The body and what was read of it are freed once this returns: handed back to the OS after.
    trimMemorySoon();
    for (const d of dumped) {
      const ix = registry.indexForRestore(d.name, d.blockSize);
      if (typeof ix === 'string') {
        onWarning?.("a peer's index was not loaded", { peer, index: d.name, error: ix });
        continue;
      }
      const r = ix.restore(d, registry.selfRecovering(d.name));
      out.indexes.push({ name: d.name, segments: r.segments, blocks: r.blocks, skipped: d.skipped });
    }
    return out;
  }
  return null;
}

/** A peer's `/dump`, read as a router reads a node's answers. */
function fetchDump(peer: string): Promise<Buffer> {
  return nodeGet(`${peer.replace(/\/+$/, '')}/`, 'dump', {
    limit: DUMP_BYTES,
    timeoutMs: DUMP_TIMEOUT_MS,
    firstByteMs: DUMP_HEADERS_MS,
  });
}
