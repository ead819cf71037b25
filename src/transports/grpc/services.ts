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

/** Each engine's service, by the engine's name (`--grpc-engine`). */
export const ENGINE_SERVICE: Readonly<Record<string, KvEventService>> = {
  vllm: KV_EVENT_SERVICES[0],
  sglang: KV_EVENT_SERVICES[1],
  trtllm: KV_EVENT_SERVICES[2],
  tokenspeed: KV_EVENT_SERVICES[3],
};

export type KvEventService = (typeof KV_EVENT_SERVICES)[number];

/** The full method path of `SubscribeKvEvents` on `service`. */
export function subscribePath(service: string): string {
  return `/${service}/SubscribeKvEvents`;
}

const raw = (b: Buffer) => b;

/**
 * A gRPC method whose messages are bytes both ways: @grpc/grpc-js's `MethodDefinition<Buffer,
 * Buffer>` by shape, declared here so the package's types never name an optional dependency.
 */
export interface RawMethodDefinition {
  path: string;
  requestStream: boolean;
  responseStream: boolean;
  requestSerialize: (value: Buffer) => Buffer;
  requestDeserialize: (bytes: Buffer) => Buffer;
  responseSerialize: (value: Buffer) => Buffer;
  responseDeserialize: (bytes: Buffer) => Buffer;
}

/** Methods by name: @grpc/grpc-js's `ServiceDefinition` by shape. */
export type RawServiceDefinition = Record<string, RawMethodDefinition>;

/** A method definition whose messages are bytes both ways (kvplane decodes what it owns itself). */
export function rawMethod(path: string, requestStream: boolean, responseStream: boolean): RawMethodDefinition {
  return {
    path,
    requestStream,
    responseStream,
    requestSerialize: raw,
    requestDeserialize: raw,
    responseSerialize: raw,
    responseDeserialize: raw,
  };
}

/** `service`'s `HealthCheckResponse` (vLLM, SGLang, TokenSpeed: healthy + message; TRT-LLM: status). */
export function encodeHealthResponse(service: string, healthy: boolean, message: string): Buffer {
  return callNative(() => native.encodeHealthResponse(service, healthy, message));
}

/**
 * `SubscribeKvEvents` on `service` with raw bytes both ways: requests are read by the core, and
 * responses are `KvEventBatch` bytes encoded once per batch in Rust and written as they are to
 * every subscriber.
 */
export function subscribeDefinition(service: string): RawServiceDefinition {
  return { SubscribeKvEvents: rawMethod(subscribePath(service), false, true) };
}

/** SMG's `SubscribeKvEventsRequest` bytes for a start seq (0 = live from now). */
export function encodeSubscribeRequest(start: bigint): Buffer {
  return callNative(() => native.encodeSubscribeRequest(start));
}

/** A `SubscribeKvEventsRequest`, read. */
export interface SubscribeRequest {
  /** `start_sequence_number` (0: the current state). */
  start: bigint;
  /** `load_records_before_first_batch`: the subscriber takes `load_only` batches numbered 0. */
  loadRecordsEarly: boolean;
}

/** Reads a `SubscribeKvEventsRequest` (`ERR_DECODE` if it is not one). */
export function decodeSubscribeRequest(bytes: Buffer): SubscribeRequest {
  return callNative(() => native.decodeSubscribeRequest(bytes));
}
