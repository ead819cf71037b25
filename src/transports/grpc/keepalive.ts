import { checkCount, INT32_MAX } from '../zmq/config.js';

/** The longest wait for a keepalive ping's answer. */
const KEEPALIVE_TIMEOUT_MS = 10_000;

/**
 * grpc-js's channel (or server) options that ping a connection every `ms` (checked as
 * `keepaliveMs`) and drop it when a ping is not answered within 10 s, or `ms` if shorter.
 */
export function keepaliveOptions(ms: number): {
  'grpc.keepalive_time_ms': number;
  'grpc.keepalive_timeout_ms': number;
} {
  const time = checkCount('keepaliveMs', ms, INT32_MAX);
  return { 'grpc.keepalive_time_ms': time, 'grpc.keepalive_timeout_ms': Math.min(KEEPALIVE_TIMEOUT_MS, time) };
}
