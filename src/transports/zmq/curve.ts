import { createPrivateKey, createPublicKey } from 'node:crypto';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import type { Reply } from 'zeromq';
import { invalidArg, KvPlaneError } from '../../errors.js';
import { zeromq } from '../../optional.js';

/**
 * CURVE encryption and authentication of the ZMQ sockets (docs/protocol.md#zmq-curve), the ZMQ
 * counterpart of the HTTP/gRPC bearer token.
 */
export interface ZmqCurveOptions {
  /** The node's CURVE secret key, Z85 (40 characters). Clients need its public key (`curvePublicKey`). */
  secretKey: string;
  /**
   * Public keys (Z85) of the clients allowed to connect. Absent or `null`: any client that knows
   * the node's public key (traffic is still encrypted).
   */
  allowedClients?: readonly string[] | null;
}

const Z85 = '0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#';
const Z85_VALUE = new Map([...Z85].map((c, i) => [c, i]));

/** Z85 text of 32 key bytes. */
export function z85Encode(bytes: Uint8Array): string {
  let out = '';
  for (let i = 0; i < bytes.length; i += 4) {
    let v = (((bytes[i] as number) << 24) >>> 0) + ((bytes[i + 1] as number) << 16) + ((bytes[i + 2] as number) << 8);
    v += bytes[i + 3] as number;
    let group = '';
    for (let k = 0; k < 5; k++) {
      group = Z85[v % 85] + group;
      v = Math.floor(v / 85);
    }
    out += group;
  }
  return out;
}

/** The 32 bytes of a Z85 key (`ERR_INVALID_ARG` unless it is 40 Z85 characters). */
export function z85Decode(key: string, what: string): Buffer {
  if (key.length !== 40) invalidArg(`${what} is not a CURVE key: 40 Z85 characters expected, got ${key.length}`);
  const out = Buffer.alloc(32);
  for (let i = 0; i < 8; i++) {
    let v = 0;
    for (let k = 0; k < 5; k++) {
      const d = Z85_VALUE.get(key[i * 5 + k] as string);
      if (d === undefined) invalidArg(`${what} is not a CURVE key: ${JSON.stringify(key[i * 5 + k])} is not Z85`);
      v = v * 85 + d;
    }
    if (v > 0xffffffff) invalidArg(`${what} is not a CURVE key: a group overflows 32 bits`);
    out.writeUInt32BE(v, i * 4);
  }
  return out;
}

/** PKCS#8 prefix of a raw X25519 private key (CURVE keys are X25519 keys). */
const X25519_PKCS8 = Buffer.from('302e020100300506032b656e04220420', 'hex');

/** The public key (Z85) of a CURVE secret key: what clients set as `curveServerKey`. */
export function curvePublicKey(secretKey: string): string {
  const raw = z85Decode(secretKey, 'the CURVE secret key');
  const priv = createPrivateKey({ key: Buffer.concat([X25519_PKCS8, raw]), format: 'der', type: 'pkcs8' });
  const x = createPublicKey(priv).export({ format: 'jwk' }).x as string;
  return z85Encode(Buffer.from(x, 'base64url'));
}

/**
 * A key from a file: a ZMQ certificate (`public-key = "..."` / `secret-key = "..."` lines, as
 * pyzmq's `zmq.auth.create_certificates` and czmq write them) or the bare Z85 key.
 */
function keysIn(text: string, kind: 'public' | 'secret'): string[] {
  const cert = [...text.matchAll(new RegExp(`^\\s*${kind}-key\\s*=\\s*"([^"]{40})"`, 'gm'))].map((m) => m[1] as string);
  if (cert.length > 0) return cert;
  return text
    .split(/\r?\n/)
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#') && !l.includes('='));
}

/** The secret key of a certificate file (`secret-key = "..."`) or a file holding the bare key. */
export function readCurveSecretKey(file: string): string {
  const keys = keysIn(readFileSync(file, 'utf8'), 'secret');
  if (keys.length !== 1) invalidArg(`${file}: expected one CURVE secret key, found ${keys.length}`);
  z85Decode(keys[0] as string, `the key in ${file}`);
  return keys[0] as string;
}

/**
 * Client public keys: from a directory, the `public-key` of every `*.key` certificate in it (the
 * layout pyzmq's authenticator reads); from a file, its certificate's key or one bare key per line.
 */
export function readCurveClients(path: string): string[] {
  const files = statSync(path).isDirectory()
    ? readdirSync(path)
        .filter((f) => f.endsWith('.key'))
        .map((f) => join(path, f))
    : [path];
  const keys = files.flatMap((f) => keysIn(readFileSync(f, 'utf8'), 'public'));
  for (const k of keys) z85Decode(k, `a client key in ${path}`);
  if (keys.length === 0) invalidArg(`${path}: no CURVE public keys found`);
  return keys;
}

/** Socket options of a CURVE server socket checked against `domain`'s allowed clients. */
export function curveServerOptions(curve: ZmqCurveOptions, domain: string) {
  z85Decode(curve.secretKey, 'the CURVE secret key');
  return { curveServer: true, curveSecretKey: curve.secretKey, zapDomain: domain };
}

/**
 * The process's ZAP handler (RFC 27, `inproc://zeromq.zap.01`): libzmq asks it about every CURVE
 * client; it accepts the keys allowed for the socket's domain and counts the others. Domains it
 * does not know (sockets outside kvplane) are accepted, as libzmq does without a handler.
 */
class ZapHandler {
  readonly #domains = new Map<string, { allowed: Set<string> | null; refused: number }>();
  #socket: Reply | null = null;
  #next = 0;

  /** Registers a domain for a socket pair; returns its name. */
  async register(allowed: readonly string[] | null): Promise<string> {
    if (this.#socket === null && allowed !== null) await this.#start();
    const domain = `kvplane-${++this.#next}`;
    this.#domains.set(domain, { allowed: allowed === null ? null : new Set(allowed), refused: 0 });
    return domain;
  }

  refused(domain: string): number {
    return this.#domains.get(domain)?.refused ?? 0;
  }

  unregister(domain: string): void {
    this.#domains.delete(domain);
    if (this.#domains.size === 0 && this.#socket !== null) {
      this.#socket.close();
      this.#socket = null;
    }
  }

  async #start(): Promise<void> {
    const socket = new (zeromq().Reply)({ linger: 0 });
    try {
      await socket.bind('inproc://zeromq.zap.01');
    } catch (err) {
      socket.close();
      throw new KvPlaneError(
        'ERR_INVALID_ARG',
        `cannot serve CURVE client authentication: another ZAP handler is bound in this process (${(err as Error).message})`,
        { cause: err },
      );
    }
    this.#socket = socket;
    void this.#serve(socket);
  }

  async #serve(socket: Reply): Promise<void> {
    try {
      for await (const frames of socket) {
        // version, request id, domain, address, identity, mechanism, credentials...
        const [version, id, domain, , , mechanism, key] = frames;
        const entry = this.#domains.get(domain?.toString() ?? '');
        let ok = true;
        if (entry?.allowed) {
          ok = mechanism?.toString() === 'CURVE' && key?.length === 32 && entry.allowed.has(z85Encode(key));
          if (!ok) entry.refused++;
        }
        await socket.send([
          version ?? '1.0',
          id ?? '',
          ok ? '200' : '400',
          ok ? 'OK' : 'client key not allowed',
          '',
          '',
        ]);
      }
    } catch {
      // The handler closed.
    }
  }
}

export const zapHandler = new ZapHandler();
