import { createWriteStream, type WriteStream } from 'node:fs';

/** One answered request, as the access log writes it. */
export interface AccessEntry {
  traceId: string | null;
  method: string;
  path: string;
  model: string | null;
  status: number;
  durationMs: number;
}

/**
 * The indexer's access log (`--access-log`): a JSON line per answered request, with the fields
 * Dynamo's indexer writes (`ts`, `trace_id`, `method`, `path`, `model`, `status`,
 * `duration_ms`; `-` for what a request did not carry). Appended to the file, which `reopen`
 * opens again by its path (after a log rotation moved it).
 */
export class AccessLog {
  readonly #path: string;
  readonly #localTime: boolean;
  #out: WriteStream;
  /** Lines not written (a full disk, a removed directory): counted, never a request's error. */
  errors = 0;

  constructor(path: string, localTime = false) {
    this.#path = path;
    this.#localTime = localTime;
    this.#out = this.#open();
  }

  #open(): WriteStream {
    const out = createWriteStream(this.#path, { flags: 'a' });
    // Each line's loss is counted by its write's callback; the stream's error itself is not
    // the process's (it would throw without a listener).
    out.on('error', () => {});
    return out;
  }

  write(e: AccessEntry): void {
    const line = JSON.stringify({
      ts: this.#localTime ? localIso(new Date()) : new Date().toISOString(),
      trace_id: e.traceId ?? '-',
      method: e.method,
      path: e.path,
      model: e.model ?? '-',
      status: e.status,
      duration_ms: e.durationMs,
    });
    this.#out.write(`${line}\n`, (err) => {
      if (err) this.errors++;
    });
  }

  /** Opens the file again by its path; what was written before goes to the old one. */
  reopen(): void {
    const old = this.#out;
    this.#out = this.#open();
    old.end();
  }

  async close(): Promise<void> {
    await new Promise<void>((resolve) => this.#out.end(resolve));
  }
}

/** RFC 3339 in the local time zone, with its offset (`2026-11-28T09:50:08.868+01:00`; `+00:00` in UTC). */
function localIso(d: Date): string {
  const p = (n: number, w = 2) => String(n).padStart(w, '0');
  const off = -d.getTimezoneOffset();
  const zone = `${off >= 0 ? '+' : '-'}${p(Math.floor(Math.abs(off) / 60))}:${p(Math.abs(off) % 60)}`;
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}:${p(
    d.getSeconds(),
  )}.${p(d.getMilliseconds(), 3)}${zone}`;
}
