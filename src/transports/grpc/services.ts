import type { ServiceDefinition } from '@grpc/grpc-js';
import { callNative } from '../../errors.js';
import native from '../../native.js';

/**
 * The engine services routers call `SubscribeKvEvents` on (docs/protocol.md#grpc-subscribekvevents); kvplane serves the RPC
 * under every one of them, so a router configured for any engine finds it.
 */
export const KV_EVENT_SERVICES = [
  'vllm.grpc.engine.VllmEngine',
  'sglang.grpc.scheduler.SglangScheduler',
  'trtllm.TrtllmService',
  'tokenspeed.grpc.scheduler.TokenSpeedScheduler',
] as const;

export type KvEventService = (typeof KV_EVENT_SERVICES)[number];

/** The full method path of `SubscribeKvEvents` on `service`. */
export function subscribePath(service: string): string {
  return `/${service}/SubscribeKvEvents`;
}

const raw = (b: Buffer) => b;

/**
 * `SubscribeKvEvents` on `service` with raw bytes both ways: requests are read by the core, and
 * responses are `KvEventBatch` bytes encoded once per batch in Rust and written as they are to
 * every subscriber.
 */
export function subscribeDefinition(service: string): ServiceDefinition {
  return {
    SubscribeKvEvents: {
      path: subscribePath(service),
      requestStream: false,
      responseStream: true,
      requestSerialize: raw,
      requestDeserialize: raw,
      responseSerialize: raw,
      responseDeserialize: raw,
    },
  };
}

/** SMG's `SubscribeKvEventsRequest` bytes for a start seq (0 = live from now). */
export function encodeSubscribeRequest(start: bigint): Buffer {
  return callNative(() => native.encodeSubscribeRequest(start));
}

/** The `start_sequence_number` of a `SubscribeKvEventsRequest`. */
export function decodeSubscribeRequest(bytes: Buffer): bigint {
  return callNative(() => native.decodeSubscribeRequest(bytes));
}
