import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { bindOrThrow } from '../../errors.js';
import { idleConnectionMs } from '../idle.js';

/**
 * How long a connection may go without sending or receiving a byte before it is closed (Node's
 * `server.timeout`): a connection that never sends a request counts too, which Node's own
 * request and header timeouts do not cover. Default 60,000 ms.
 */
export const DEFAULT_HTTP_IDLE_MS = 60_000;

/** Listens on `host:port`; an address that cannot be bound is `ERR_BIND`. */
export function listen(server: Server, port: number, host: string): Promise<void> {
  const address = host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
  return bindOrThrow(
    'HTTP',
    address,
    () =>
      new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(port, host, () => {
          server.off('error', reject);
          resolve();
        });
      }),
  );
}

/**
 * A request's target as a URL, or `null` when it is not one: Node's HTTP parser lets through
 * targets (`//[`, `http://a:99999/`) that `URL` refuses.
 */
export function requestUrl(req: IncomingMessage, base: string): URL | null {
  try {
    return new URL(req.url ?? '/', base);
  } catch {
    return null;
  }
}

/**
 * Serves `handle` for each request, and answers in JSON what would otherwise end without one: a
 * request Node's HTTP parser refuses (400, 431 for headers too large, 408 for a request too slow)
 * and any error `handle` lets out (500, or the connection closed when the answer had begun).
 */
export function serveJson(
  server: Server,
  handle: (req: IncomingMessage, res: ServerResponse) => Promise<void>,
  idleMs: number | undefined,
): void {
  // Without it, peers that connect and say nothing hold the process's file descriptors for good.
  server.timeout = idleConnectionMs(idleMs, DEFAULT_HTTP_IDLE_MS);
  server.on('request', (req: IncomingMessage, res: ServerResponse) => {
    handle(req, res).catch((err: Error) => {
      if (res.headersSent) return void res.destroy();
      const body = JSON.stringify({ error: err.message });
      res.writeHead(500, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
      res.end(body);
    });
  });
  server.on('clientError', (err: NodeJS.ErrnoException, socket: Socket) => {
    // Where Node answers itself: unless an answer on this connection has begun (a keep-alive
    // connection's next request is answered; a half-written answer is not followed by another).
    const inFlight = (socket as Socket & { _httpMessage?: { headersSent?: boolean } })._httpMessage;
    if (err.code === 'ECONNRESET' || !socket.writable || inFlight?.headersSent) return void socket.destroy();
    const [status, reason] =
      err.code === 'HPE_HEADER_OVERFLOW'
        ? [431, 'Request Header Fields Too Large']
        : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
          ? [408, 'Request Timeout']
          : [400, 'Bad Request'];
    const body = JSON.stringify({ error: `malformed HTTP request: ${err.code ?? err.message}` });
    socket.end(
      `HTTP/1.1 ${status} ${reason}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
    );
  });
}
