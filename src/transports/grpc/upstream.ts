import type {
  Client,
  ClientDuplexStream,
  ClientReadableStream,
  ClientUnaryCall,
  Metadata,
  ServerDuplexStream,
  ServerReadableStream,
  ServerUnaryCall,
  ServerWritableStream,
  ServiceError,
  StatusObject,
  sendUnaryData,
} from '@grpc/grpc-js';
import { grpcJs } from '../../optional.js';
import type { EngineMethod } from './engine_methods.js';
import { status } from './status.js';

const raw = (b: Buffer) => b;

/** A grpc-js server handler of any of the four shapes. */
// biome-ignore lint/suspicious/noExplicitAny: grpc-js types each shape's handler differently
export type AnyHandler = (call: any, callback?: any) => void;

/**
 * How long forwarded calls wait on a connection the engine took without answering (grpcio's own
 * connect timeout is 20 s).
 */
const CONNECT_WAIT_MS = 20_000;

/** The longest wait between attempts to reach an engine that is down. */
const UPSTREAM_RECONNECT_MAX_MS = 1000;

/** A status of kvplane's own for a forwarded call (no engine trailers). */
function ownStatus(code: number, details: string): ServiceError {
  return Object.assign(new Error(details), { code, details, metadata: new (grpcJs().Metadata)() }) as ServiceError;
}

/** Headers kvplane does not pass on: its own credential (checked here, not the engine's). */
const OWN_HEADERS = ['authorization'];

/**
 * The engine's own gRPC server behind kvplane (docs/protocol.md#grpc-upstream): every RPC kvplane
 * does not serve itself is forwarded to it as opaque bytes, in whichever directions it streams,
 * with the caller's metadata and deadline, cancellation both ways, and the engine's headers,
 * trailers and status passed back. An engine that is down answers UNAVAILABLE.
 */
export class GrpcUpstream {
  readonly address: string;
  readonly #client: Client;
  /** Since when the channel has been connecting without an answer, while it is. */
  #connectingSince: number | null = null;
  /** Each forwarded call in flight: ends it with a status of kvplane's own. */
  readonly #inFlight = new Set<(s: ServiceError) => void>();

  constructor(address: string) {
    this.address = address;
    const grpc = grpcJs();
    this.#client = new grpc.Client(address, grpc.credentials.createInsecure(), {
      'grpc.max_receive_message_length': -1,
      'grpc.max_send_message_length': -1,
      // An engine that comes up (its port opens after minutes of loading) or back is reached
      // within a second: grpc-js's own backoff grows to 2 minutes, each call UNAVAILABLE meanwhile.
      'grpc.initial_reconnect_backoff_ms': 100,
      'grpc.max_reconnect_backoff_ms': UPSTREAM_RECONNECT_MAX_MS,
    });
    this.#followState(this.#client.getChannel().getConnectivityState(false));
  }

  /** Keeps `#connectingSince`: when the channel began its current attempt, while it connects. */
  #followState(state: number): void {
    const channel = this.#client.getChannel();
    const { CONNECTING, SHUTDOWN } = grpcJs().connectivityState;
    if (state === SHUTDOWN) return;
    channel.watchConnectivityState(state, Number.POSITIVE_INFINITY, () => {
      const now = channel.getConnectivityState(false);
      this.#connectingSince = now === CONNECTING ? Date.now() : null;
      this.#followState(now);
    });
  }

  /** The handler forwarding `path` (`/service/Method`) of shape `method`. */
  handler(path: string, method: EngineMethod): AnyHandler {
    if (!method.requestStream && !method.responseStream) {
      return (call: ServerUnaryCall<Buffer, Buffer>, callback: sendUnaryData<Buffer>) =>
        this.#whenReachable(
          call,
          () => this.#unary(path, call, callback),
          (err) => callback(err),
        );
    }
    const failStream = (call: { emit(ev: 'error', e: unknown): void }) => (err: ServiceError) =>
      call.emit('error', err);
    if (!method.requestStream) {
      return (call: ServerWritableStream<Buffer, Buffer>) =>
        this.#whenReachable(call, () => this.#serverStream(path, call), failStream(call));
    }
    if (!method.responseStream) {
      return (call: ServerReadableStream<Buffer, Buffer>, callback: sendUnaryData<Buffer>) =>
        this.#whenReachable(
          call,
          () => this.#clientStream(path, call, callback),
          (err) => callback(err),
        );
    }
    return (call: ServerDuplexStream<Buffer, Buffer>) =>
      this.#whenReachable(call, () => this.#bidi(path, call), failStream(call));
  }

  /**
   * Runs `go` once the channel to the engine is connected, or has failed to connect (a call then
   * fails fast, UNAVAILABLE). A connection the engine took but never answers on (a frozen
   * process: its kernel still accepts) would hold calls for good, as grpc-js waits for the
   * engine's HTTP/2 settings without a bound: after `CONNECT_WAIT_MS` of that, `fail`.
   */
  #whenReachable(
    call: { on(ev: 'cancelled', f: () => void): unknown },
    go: () => void,
    fail: (e: ServiceError) => void,
  ) {
    const channel = this.#client.getChannel();
    const { CONNECTING, IDLE, SHUTDOWN } = grpcJs().connectivityState;
    const unavailable = (details: string) => {
      try {
        fail(ownStatus(status.UNAVAILABLE, details));
      } catch {
        // The call has ended already (its server is gone).
      }
    };
    const proceed = (state: number) => {
      // Closed (kvplane shutting down): no call can start on it.
      if (state === SHUTDOWN) return unavailable('kvplane is shutting down');
      try {
        go();
      } catch (err) {
        unavailable((err as Error).message);
      }
    };
    let state = channel.getConnectivityState(true);
    if (state !== CONNECTING && state !== IDLE) return proceed(state);
    // (`#followState` restarts the clock at each new attempt.)
    this.#connectingSince ??= Date.now();
    const until = this.#connectingSince + CONNECT_WAIT_MS;
    let cancelled = false;
    call.on('cancelled', () => {
      cancelled = true;
    });
    const watch = () =>
      channel.watchConnectivityState(state, until, (err?: Error) => {
        if (cancelled) return;
        state = channel.getConnectivityState(false);
        if (state !== CONNECTING && state !== IDLE) return proceed(state);
        if (!err) return watch();
        unavailable(
          `the engine at ${this.address} took the connection but has not answered in ${CONNECT_WAIT_MS / 1000} s`,
        );
      });
    watch();
  }

  /** One unary call of kvplane's own to the engine: its answer, or its error status. */
  unary(path: string, request: Buffer, timeoutMs: number): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      this.#client.makeUnaryRequest(
        path,
        raw,
        raw,
        request,
        { deadline: Date.now() + timeoutMs },
        (err: ServiceError | null, reply?: Buffer) => (err ? reject(err) : resolve(reply as Buffer)),
      );
    });
  }

  close(): void {
    this.#client.close();
  }

  /**
   * Ends every forwarded call in flight with `code` (kvplane shutting down: UNAVAILABLE, which a
   * gateway retries elsewhere) and cancels its engine call.
   */
  endInFlight(code: number, details: string): void {
    const s = ownStatus(code, details);
    for (const end of [...this.#inFlight]) end(s);
  }

  /** Keeps `end` while the call is in flight (`untrack`, once it ends). */
  #track(end: (s: ServiceError) => void): () => void {
    this.#inFlight.add(end);
    return () => this.#inFlight.delete(end);
  }

  #unary(path: string, call: ServerUnaryCall<Buffer, Buffer>, callback: sendUnaryData<Buffer>): void {
    const answer = answered(call, callback, (end) => this.#track(end));
    const md = forwarded(call.metadata);
    answer.follow(this.#client.makeUnaryRequest(path, raw, raw, call.request, md, answer.options, answer.reply));
  }

  #serverStream(path: string, call: ServerWritableStream<Buffer, Buffer>): void {
    const up = this.#client.makeServerStreamRequest(path, raw, raw, call.request, forwarded(call.metadata), {
      deadline: call.getDeadline(),
    });
    pipeDown(up, call, (end) => this.#track(end));
  }

  #clientStream(path: string, call: ServerReadableStream<Buffer, Buffer>, callback: sendUnaryData<Buffer>): void {
    const answer = answered(call, callback, (end) => this.#track(end));
    const md = forwarded(call.metadata);
    const up = this.#client.makeClientStreamRequest(path, raw, raw, md, answer.options, answer.reply);
    answer.follow(up);
    pipeUp(call, up);
  }

  #bidi(path: string, call: ServerDuplexStream<Buffer, Buffer>): void {
    const up = this.#client.makeBidiStreamRequest(path, raw, raw, forwarded(call.metadata), {
      deadline: call.getDeadline(),
    });
    pipeUp(call, up);
    pipeDown(up, call, (end) => this.#track(end));
  }
}

/** Registers a call's `end` while it is in flight; gives back what unregisters it. */
type Track = (end: (s: ServiceError) => void) => () => void;

/**
 * A single-response call forwarded: the caller's deadline goes to the engine (`options`), the
 * engine's headers come back, a cancelled caller cancels it (`follow`), and the engine's reply and
 * its status (with the trailers), which arrive separately in either order, reach the caller at
 * once.
 */
function answered(
  call: ServerUnaryCall<Buffer, Buffer> | ServerReadableStream<Buffer, Buffer>,
  callback: sendUnaryData<Buffer>,
  track: Track,
): {
  options: { deadline: ReturnType<typeof call.getDeadline> };
  reply: (err: ServiceError | null, reply?: Buffer) => void;
  follow: (up: ClientUnaryCall) => void;
} {
  let result: { err: ServiceError | null; reply?: Buffer } | undefined;
  let trailers: Metadata | undefined;
  let done = false;
  let untrack = () => {};
  const finish = () => {
    if (done || result === undefined || (result.err === null && trailers === undefined)) return;
    done = true;
    untrack();
    if (result.err) callback(result.err);
    else callback(null, result.reply, trailers);
  };
  return {
    options: { deadline: call.getDeadline() },
    reply: (err, reply) => {
      result ??= { err, reply };
      finish();
    },
    follow: (up) => {
      untrack = track((err) => {
        result = { err };
        finish();
        up.cancel();
      });
      up.on('metadata', (md: Metadata) => call.sendMetadata(md));
      up.on('status', (s: StatusObject) => {
        trailers = s.metadata;
        finish();
      });
      call.on('cancelled', () => {
        untrack();
        up.cancel();
      });
    },
  };
}

/** The caller's metadata as sent on to the engine. */
function forwarded(md: Metadata): Metadata {
  const out = md.clone();
  for (const h of OWN_HEADERS) out.remove(h);
  return out;
}

/**
 * Bytes of the engine's responses a forwarded stream holds for a caller slower than the engine
 * (read from the engine, not yet sent on the caller's connection): past this the engine's stream
 * is paused (HTTP/2 flow control then holds the engine back), and resumed below half of it. 1 MiB,
 * Envoy's default buffer limit.
 */
const HOLD_BYTES = 1 << 20;

/**
 * The engine's responses to the caller, at the caller's pace up to `HOLD_BYTES` held; its status
 * ends the call once every response has been sent on. (grpc-js reports the status as soon as it
 * arrives, while a paused stream may still hold responses: ending the call then would drop them.
 * And on an error status it drops the responses it has not handed out yet: a stream is paused only
 * past `HOLD_BYTES`, so a caller behind by less gets every response before the error, as it would
 * from the engine itself.)
 */
function pipeDown(
  up: ClientReadableStream<Buffer> | ClientDuplexStream<Buffer, Buffer>,
  call: ServerWritableStream<Buffer, Buffer> | ServerDuplexStream<Buffer, Buffer>,
  track: Track,
): void {
  up.on('metadata', (md: Metadata) => call.sendMetadata(md));
  // Responses written to the caller and not yet sent, and their bytes.
  let writes = 0;
  let held = 0;
  let paused = false;
  up.on('data', (d: Buffer) => {
    writes++;
    held += d.length;
    call.write(d, () => {
      writes--;
      held -= d.length;
      if (paused && held <= HOLD_BYTES / 2) {
        paused = false;
        up.resume();
      }
      end();
    });
    if (!paused && held > HOLD_BYTES) {
      paused = true;
      up.pause();
    }
  });
  let final: StatusObject | null = null;
  let read = false;
  let ended = false;
  // Set when kvplane ends the call itself (shutting down): it does not wait for a slow caller.
  let now = false;
  const end = () => {
    if (ended || final === null || !read || (writes > 0 && !now)) return;
    ended = true;
    untrack();
    if (final.code === status.OK) call.end(final.metadata);
    else call.emit('error', Object.assign(new Error(final.details), final) as ServiceError);
  };
  const untrack = track((s) => {
    final = s;
    read = true;
    now = true;
    end();
    up.cancel();
  });
  // `error` carries a non-OK status; `status` comes for every end, `end` once all is read (a
  // stream closed without it has nothing more to give).
  up.on('error', () => {});
  up.on('status', (s: StatusObject) => {
    final = s;
    end();
  });
  for (const ev of ['end', 'close'] as const) {
    up.on(ev, () => {
      read = true;
      end();
    });
  }
  call.on('cancelled', () => {
    untrack();
    up.cancel();
  });
}

/** The caller's requests to the engine, at the engine's pace. */
function pipeUp(
  call: ServerReadableStream<Buffer, Buffer> | ServerDuplexStream<Buffer, Buffer>,
  up: { write(d: Buffer): boolean; end(): void; once(ev: 'drain', f: () => void): unknown },
): void {
  call.on('data', (d: Buffer) => {
    if (!up.write(d)) {
      call.pause();
      up.once('drain', () => call.resume());
    }
  });
  call.on('end', () => up.end());
}
