import { createRequire } from 'node:module';
import { KvPlaneError } from './errors.js';

const load = createRequire(import.meta.url);
const loaded = new Map<string, unknown>();

/**
 * An optional peer dependency, loaded the first time a part that needs it runs, so that users of
 * hashing and the router index install neither. Missing, it is `ERR_MISSING_DEPENDENCY` naming the
 * package to install.
 */
function peer<T>(name: string, forWhat: string): T {
  let m = loaded.get(name);
  if (m === undefined) {
    try {
      m = load(name);
    } catch (err) {
      throw new KvPlaneError(
        'ERR_MISSING_DEPENDENCY',
        `${forWhat} needs the optional package ${name}: npm install ${name}`,
        { cause: err },
      );
    }
    loaded.set(name, m);
  }
  return m as T;
}

/** zeromq.js: the ZMQ publisher, its replay socket and CURVE, and engine sources read in JS. */
export function zeromq(): typeof import('zeromq') {
  return peer('zeromq', 'ZMQ (the publisher, replay, CURVE, engine sources)');
}

/** @grpc/grpc-js: `SubscribeKvEvents`, the SMG proxy, and the router's gRPC subscriptions. */
export function grpcJs(): typeof import('@grpc/grpc-js') {
  return peer('@grpc/grpc-js', 'gRPC (SubscribeKvEvents, the SMG proxy, gRPC subscriptions)');
}
