#!/usr/bin/env node
import { KvPlaneError } from '../errors.js';
import { connectWarning } from '../transports/zmq/config.js';
import { indexerHelp, parseIndexerArgs, startIndexer } from './indexer.js';
import { parseServeArgs, type Serving, serveHelp, startServe } from './serve/index.js';

const USAGE = `Usage: kvplane <command> [flags]

Commands:
  serve     run an engine node (simulated engine, ZMQ stream with replay, HTTP recovery, gRPC)
  indexer   run a router-side KV indexer with Dynamo's indexer HTTP API

Run "kvplane serve --help" or "kvplane indexer --help" for their flags.
`;

function log(fields: Record<string, unknown>): void {
  process.stdout.write(
    `${JSON.stringify({ time: new Date().toISOString(), ...fields }, (_k, v) => (typeof v === 'bigint' ? v.toString() : v))}\n`,
  );
}

function rate(n: number): string {
  return n >= 1e6 ? `${(n / 1e6).toFixed(2)}M` : n >= 1e3 ? `${(n / 1e3).toFixed(1)}k` : n.toFixed(0);
}

/** Status every `seconds`: a live line on a TTY, a JSON log line otherwise. */
function reportStatus(s: Serving, seconds: number): () => void {
  const tty = process.stdout.isTTY === true;
  let last = { events: 0, batches: 0, at: performance.now() };
  const tick = () => {
    const p = s.publisher.stats();
    const ix = s.publisher.indexer.stats();
    const now = performance.now();
    const dt = (now - last.at) / 1000;
    const eventsPerSec = (p.events - last.events) / dt;
    const batchesPerSec = (p.batches - last.batches) / dt;
    last = { events: p.events, batches: p.batches, at: now };
    const drops = p.drops.queue_full + p.drops.send_failed;
    const g = s.grpc?.stats();
    const grpcSubs = g?.subscribers ?? 0;
    if (tty) {
      process.stdout.write(
        `\r\x1b[Kseq ${p.lastSeq} | ${rate(eventsPerSec)} events/s | ${rate(batchesPerSec)} batches/s | blocks ${ix.blocks} | subscribers ${p.subscribers + grpcSubs} | drops ${drops} | gaps ${p.gaps} | replays ${p.replay.requests}`,
      );
    } else {
      log({
        level: 'info',
        msg: 'status',
        last_seq: p.lastSeq,
        events_per_sec: Math.round(eventsPerSec),
        batches_per_sec: Math.round(batchesPerSec),
        events: p.events,
        batches: p.batches,
        blocks: ix.blocks,
        subscribers: p.subscribers,
        grpc_subscribers: grpcSubs,
        grpc_cut_off: g?.cutOff ?? 0,
        drops: p.drops,
        gaps: p.gaps,
        replay_requests: p.replay.requests,
        replay_sessions: p.replay.sessions,
        replay_abandoned: p.replay.abandoned,
        replay_malformed: p.replay.malformed,
        replay_batches: p.replay.batchesSent,
        replay_batches_copied: p.replay.batchesCopied,
        memory_mib: memoryMib(),
        fail_closed: p.failClosed.length,
      });
    }
  };
  const timer = setInterval(() => {
    // A status line that cannot be made (the process out of file descriptors: reading its own
    // memory needs one) is skipped, not a crash of everything the node serves.
    try {
      tick();
    } catch (err) {
      log({ level: 'warn', msg: 'status skipped', error: (err as Error).message });
    }
  }, seconds * 1000);
  return () => {
    clearInterval(timer);
    if (tty) process.stdout.write('\n');
  };
}

/** The process's memory in MiB: resident, V8 heap in use, and memory outside the heap held by JS objects (Buffers). */
function memoryMib(): { rss: number; heap: number; heap_total: number; external: number } {
  const m = process.memoryUsage();
  const mib = (n: number) => Math.round(n / 1048576);
  return { rss: mib(m.rss), heap: mib(m.heapUsed), heap_total: mib(m.heapTotal), external: mib(m.external) };
}

/** Resolves on SIGINT, SIGTERM or after `durationSeconds` (0: never), logging which. */
function stopped(durationSeconds: number, before?: () => void): Promise<void> {
  return new Promise<void>((resolve) => {
    const done = (signal: string) => () => {
      before?.();
      log({ level: 'info', msg: 'stopping', signal });
      resolve();
    };
    process.once('SIGINT', done('SIGINT'));
    process.once('SIGTERM', done('SIGTERM'));
    if (durationSeconds > 0) setTimeout(done('duration'), durationSeconds * 1000).unref();
  });
}

async function serve(argv: string[]): Promise<void> {
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(serveHelp());
    return;
  }
  const config = parseServeArgs(argv);
  const s = await startServe(config, (msg, detail) => log({ level: 'warn', msg, ...detail }));
  for (const endpoint of [config.publisher.endpoint, config.publisher.replayEndpoint]) {
    const warning = endpoint ? connectWarning(endpoint) : null;
    if (warning) log({ level: 'warn', msg: 'endpoint connects', endpoint, detail: warning });
  }
  log({
    level: 'info',
    msg: 'serving',
    engine: config.engine,
    endpoint: s.publisher.endpoint,
    replay_endpoint: s.publisher.replayEndpoint,
    http: s.http?.url ?? null,
    grpc_port: s.grpc?.port ?? null,
    epoch: s.publisher.epoch,
    dp_rank: s.publisher.dataParallelRank,
    ...(s.publisher.curvePublicKey ? { curve_public_key: s.publisher.curvePublicKey } : {}),
  });
  const stopStatus = reportStatus(s, config.statusSeconds);
  await stopped(config.durationSeconds, stopStatus);
  const p = s.publisher.stats();
  await s.stop();
  log({
    level: 'info',
    msg: 'stopped',
    last_seq: p.lastSeq,
    events: p.events,
    batches: p.batches,
    [config.engine]: s.source.stats(),
  });
}

async function indexer(argv: string[]): Promise<void> {
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(indexerHelp());
    return;
  }
  const config = parseIndexerArgs(argv);
  const server = await startIndexer(config, (msg, detail) => log({ level: 'warn', msg, ...detail }));
  log({
    level: 'info',
    msg: 'indexing',
    http: `http://${config.host}:${server.port}`,
    workers: server.registry.registrations().length,
    state_file: config.stateFile ?? null,
    peers: server.peers.list(),
    // What the start loaded from a peer, per index.
    recovered_from: server.peerRecovery?.peer ?? null,
    recovered: server.peerRecovery?.indexes ?? [],
  });
  await stopped(config.durationSeconds);
  await server.close();
}

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  try {
    if (command === 'serve') await serve(rest);
    else if (command === 'indexer') await indexer(rest);
    else if (command === undefined || command === '--help' || command === '-h') process.stdout.write(USAGE);
    else {
      process.stderr.write(`kvplane: unknown command ${JSON.stringify(command)}\n\n${USAGE}`);
      return 2;
    }
    return 0;
  } catch (err) {
    const code = err instanceof KvPlaneError ? err.code : 'ERR_INTERNAL';
    process.stderr.write(`kvplane: ${code}: ${(err as Error).message}\n`);
    return code === 'ERR_INVALID_ARG' ? 2 : 1;
  }
}

void main(process.argv.slice(2)).then((code) => {
  process.exitCode = code;
});
