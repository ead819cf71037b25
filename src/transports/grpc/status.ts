import type { status as GrpcStatus } from '@grpc/grpc-js';

/**
 * gRPC status codes (the gRPC spec's numbers), as values that need no gRPC package loaded: a
 * process that never speaks gRPC does not load @grpc/grpc-js (src/optional.ts).
 */
export const status = {
  OK: 0,
  CANCELLED: 1,
  UNKNOWN: 2,
  INVALID_ARGUMENT: 3,
  DEADLINE_EXCEEDED: 4,
  NOT_FOUND: 5,
  ALREADY_EXISTS: 6,
  PERMISSION_DENIED: 7,
  RESOURCE_EXHAUSTED: 8,
  FAILED_PRECONDITION: 9,
  ABORTED: 10,
  OUT_OF_RANGE: 11,
  UNIMPLEMENTED: 12,
  INTERNAL: 13,
  UNAVAILABLE: 14,
  DATA_LOSS: 15,
  UNAUTHENTICATED: 16,
} as const satisfies Record<keyof typeof GrpcStatus, number>;

/** A status code's name (`UNAVAILABLE`), or the number itself when it has none. */
export function statusName(code: number): string {
  return Object.keys(status).find((k) => status[k as keyof typeof status] === code) ?? String(code);
}
