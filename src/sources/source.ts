import type * as Native from '../../index.js';
import type { Dialect } from '../codec.js';
import { invalidArg } from '../errors.js';
import type { KvEvent } from '../events.js';

/** Where a source sends its events: a `KvEventStream` or a `KvEventPublisher`. */
export interface EventSink {
  publish(events: readonly KvEvent[]): number;
}

/** A source's own view of whether it is delivering. */
export interface SourceHealth {
  /** `ok`, or what is wrong (e.g. `disconnected`). */
  state: string;
  /** Why, when not `ok`. */
  reason?: string;
}

/**
 * An engine's event source (docs/architecture.md#a-new-source): turns its engine's output into
 * normalized events and hands them to a sink. `kvplane serve --engine NAME` picks one from the
 * registry.
 */
export interface EventSource {
  /** The registry name (`sim`, ...). */
  readonly name: string;
  /** What kind of input it is, as `/healthz` lists it. */
  readonly kind: string;
  /** Starts delivering events into `sink`. */
  start(sink: EventSink): Promise<void>;
  /** Stops delivering; resolves once no more events will arrive. */
  stop(): Promise<void>;
  /** The source's own counters. */
  stats(): Record<string, unknown>;
  health(): SourceHealth;
  /**
   * Per DP rank, the engine batches before what the source delivered of it that it never saw
   * (for snapshots' `unknown_before`); absent: the source always delivers everything.
   */
  unknownBefore?(): ReadonlyMap<number, bigint>;
}

/** Where relayed payloads go: a `KvEventStream` or a `KvEventPublisher`. */
export interface RelaySink extends EventSink {
  relay(payloads: Uint8Array | readonly Uint8Array[], dialect: Dialect, dpRank: number | null): number;
  relayWithEventIds(
    bytes: Uint8Array,
    dialect: Dialect,
    nextIds: Map<number, bigint>,
  ): Array<{ dpRank: number; kind: 'gap' | 'restart' }>;
  clearRank(dpRank: number | null): void;
  flush(): Promise<void>;
  /**
   * Relays a rank's live socket natively (`KvEventStream.followZmq`; `ERR_INVALID_ARG` for an
   * endpoint a native link does not speak). Absent: the source reads it with zeromq.js.
   */
  followZmq?(opts: Native.EngineLinkOptions, onDelivery: (d: Native.ZmqDeliveryOut) => void): Native.NativeZmqLink;
}

/** `sink` as a `RelaySink` (`ERR_INVALID_ARG` for a sink that cannot relay). */
export function relaySink(sink: EventSink): RelaySink {
  const r = sink as RelaySink;
  if (typeof r.relay !== 'function' || typeof r.clearRank !== 'function' || typeof r.relayWithEventIds !== 'function') {
    invalidArg('the engine sources relay into a KvEventStream or KvEventPublisher');
  }
  return r;
}
