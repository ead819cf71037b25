import type { Server } from 'node:http';
import { bindOrThrow } from '../../errors.js';

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
