/** Stable error codes. Consumers match on these; they never change meaning. */
export type KvPlaneErrorCode =
  | 'ERR_INVALID_ARG'
  | 'ERR_DECODE'
  | 'ERR_UNSUPPORTED_LAYOUT'
  | 'ERR_CLOSED'
  | 'ERR_BIND'
  | 'ERR_NATIVE_LOAD'
  | 'ERR_MISSING_DEPENDENCY'
  | 'ERR_INTERNAL';

const CODES: ReadonlySet<string> = new Set<KvPlaneErrorCode>([
  'ERR_INVALID_ARG',
  'ERR_DECODE',
  'ERR_UNSUPPORTED_LAYOUT',
  'ERR_CLOSED',
  'ERR_BIND',
  'ERR_NATIVE_LOAD',
  'ERR_MISSING_DEPENDENCY',
  'ERR_INTERNAL',
]);

/** Every error kvplane throws on bad input or failure. */
export class KvPlaneError extends Error {
  readonly code: KvPlaneErrorCode;

  constructor(code: KvPlaneErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'KvPlaneError';
    this.code = code;
  }
}

function isCode(code: unknown): code is KvPlaneErrorCode {
  return typeof code === 'string' && CODES.has(code);
}

/**
 * Turns anything the native binding threw into a `KvPlaneError`: core errors carry their code;
 * N-API conversion failures (a string where a number belongs, ...) are `ERR_INVALID_ARG`. Off-thread
 * tasks reject with the same coded errors as synchronous calls.
 */
export function toKvPlaneError(err: unknown): KvPlaneError {
  if (err instanceof KvPlaneError) return err;
  if (!(err instanceof Error)) return new KvPlaneError('ERR_INTERNAL', String(err));
  const code = (err as { code?: unknown }).code;
  if (isCode(code)) return new KvPlaneError(code, err.message, { cause: err });
  if (err instanceof TypeError || code === 'InvalidArg' || (typeof code === 'string' && code.endsWith('Expected'))) {
    return new KvPlaneError('ERR_INVALID_ARG', err.message, { cause: err });
  }
  return new KvPlaneError('ERR_INTERNAL', err.message, { cause: err });
}

/** Runs a native call, re-throwing its failure as `KvPlaneError`. */
export function callNative<T>(fn: () => T): T {
  try {
    return fn();
  } catch (err) {
    throw toKvPlaneError(err);
  }
}

/** Awaits a native promise, re-throwing its failure as `KvPlaneError`. */
export async function awaitNative<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw toKvPlaneError(err);
  }
}

/** Runs `bind`, re-throwing its failure as `ERR_BIND` naming what could not be bound where. */
export async function bindOrThrow<T>(what: string, address: string, bind: () => Promise<T>): Promise<T> {
  try {
    return await bind();
  } catch (err) {
    throw new KvPlaneError('ERR_BIND', `cannot bind ${what} on ${address}: ${(err as Error).message ?? err}`, {
      cause: err,
    });
  }
}

/** Throws `ERR_INVALID_ARG`. */
export function invalidArg(message: string): never {
  throw new KvPlaneError('ERR_INVALID_ARG', message);
}
