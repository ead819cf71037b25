import { readFileSync } from 'node:fs';
import { KvEventPublisher } from '../../publisher.js';
import { createSource } from '../../sources/registry.js';
import type { EventSource } from '../../sources/source.js';
import { type GrpcTlsOptions, KvGrpcServer } from '../../transports/grpc/server.js';
import { ENGINE_SERVICE } from '../../transports/grpc/services.js';
import { KvHttpServer } from '../../transports/http/server.js';
import { readCurveClients, readCurveSecretKey, type ZmqCurveOptions } from '../../transports/zmq/curve.js';
import { readToken } from '../token.js';
import { bad, type GrpcConfig, type ServeConfig } from './config.js';

/** A running `serve`: the source, the publisher, the HTTP and gRPC servers. */
export interface Serving {
  publisher: KvEventPublisher;
  http: KvHttpServer | null;
  grpc: KvGrpcServer | null;
  source: EventSource;
  stop(): Promise<void>;
}

function readTls(g: GrpcConfig): GrpcTlsOptions | undefined {
  if (g.tlsCert === undefined && g.tlsKey === undefined) {
    if (g.tlsCa !== undefined) bad('--grpc-tls-ca needs --grpc-tls-cert and --grpc-tls-key');
    return undefined;
  }
  if (g.tlsCert === undefined || g.tlsKey === undefined) bad('--grpc-tls-cert and --grpc-tls-key go together');
  return {
    cert: readFileSync(g.tlsCert),
    key: readFileSync(g.tlsKey),
    ca: g.tlsCa === undefined ? undefined : readFileSync(g.tlsCa),
  };
}

function readCurve(c: ServeConfig): ZmqCurveOptions | null {
  if (c.zmqCurveSecretFile === null) {
    if (c.zmqCurveClients !== null) bad('--zmq-curve-clients needs --zmq-curve-secret-file');
    return null;
  }
  return {
    secretKey: readCurveSecretKey(c.zmqCurveSecretFile),
    allowedClients: c.zmqCurveClients === null ? null : readCurveClients(c.zmqCurveClients),
  };
}

function grpcService(engine: string): string {
  const service = ENGINE_SERVICE[engine];
  if (service === undefined) bad(`--grpc-engine ${engine}: one of ${Object.keys(ENGINE_SERVICE).join(', ')}`);
  return service;
}

/** The source's part of `HealthCheck` (the server checks its own stream). */
function sourceHealth(source: EventSource): { healthy: boolean; message: string } {
  const h = source.health();
  if (h.state !== 'ok') {
    return { healthy: false, message: `KV event source ${source.name}: ${h.state}${h.reason ? ` (${h.reason})` : ''}` };
  }
  return { healthy: true, message: '' };
}

/** Starts the chosen source, the publisher (with replay) and the HTTP and gRPC servers. */
export async function startServe(
  c: ServeConfig,
  onWarning?: (msg: string, detail: Record<string, unknown>) => void,
): Promise<Serving> {
  const authToken = readToken(c.authTokenFile, 'KVPLANE_AUTH_TOKEN', '--auth-token-file');
  const tls = c.grpc ? readTls(c.grpc) : undefined;
  const source = createSource(c.engine, {
    blockSize: c.publisher.blockSize,
    sim: c.sim,
    engine: c.engineSource,
    onWarning,
  });
  const curve = readCurve(c);
  const publisher = await KvEventPublisher.create({ blockSize: c.sim.blockSize, ...c.publisher, curve });
  let http: KvHttpServer | null = null;
  let grpc: KvGrpcServer | null = null;
  try {
    if (c.grpc) {
      grpc = await KvGrpcServer.create({
        stream: publisher.stream,
        host: c.grpc.host,
        port: c.grpc.port,
        maxLagBatches: c.grpc.maxLagBatches,
        maxSnapshots: c.grpc.maxSnapshots,
        authToken,
        tls,
        upstream: c.grpc.upstream,
        loadPollMs: c.grpc.loadPollMs,
        services: c.grpc.engine === undefined ? undefined : [grpcService(c.grpc.engine)],
        health: () => sourceHealth(source),
        unknownBefore: source.unknownBefore?.bind(source),
      });
    }
    if (c.http) {
      http = await KvHttpServer.create({
        publisher,
        ...c.http,
        authToken,
        grpc,
        sources: [{ name: source.name, kind: source.kind, health: () => source.health(), stats: () => source.stats() }],
      });
    }
    await source.start(publisher.stream);
  } catch (err) {
    await grpc?.close();
    await http?.close();
    await publisher.close();
    throw err;
  }
  let stopped: Promise<void> | undefined;
  return {
    publisher,
    http,
    grpc,
    source,
    stop() {
      stopped ??= (async () => {
        await source.stop();
        await grpc?.close();
        await http?.close();
        await publisher.close();
      })();
      return stopped;
    },
  };
}
