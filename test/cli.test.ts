import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { type ClientReadableStream, credentials, Metadata, makeGenericClientConstructor } from '@grpc/grpc-js';
import { describe, expect, it } from 'vitest';
import { Subscriber } from 'zeromq';
import { decodeBatch, encodeSubscribeRequest, subscribeDefinition } from '../src/index.js';
import { repoPath, serveNode } from './fixtures.js';

const CLI = repoPath('dist/cli.js');

/**
 * `kvplane serve --engine sim` with `config`, its live and replay sockets on loopback and a status
 * line every 0.2 s, run under `wrapper` (a command and its arguments) if given: its JSON log lines
 * as they come, its exit code, and a wait for a condition on them.
 */
function serveSim(config: string, wrapper: string[] = [], env: NodeJS.ProcessEnv = process.env) {
  const args = [
    ...wrapper.slice(1),
    ...(wrapper.length > 0 ? [process.execPath] : []),
    CLI,
    'serve',
    '--engine',
    'sim',
    '--config',
    config,
    '--endpoint',
    'tcp://127.0.0.1:*',
    '--replay-endpoint',
    'tcp://127.0.0.1:*',
    '--status-interval',
    '0.2',
  ];
  const proc = spawn(wrapper[0] ?? process.execPath, args, { env });
  const lines: Record<string, unknown>[] = [];
  createInterface({ input: proc.stdout }).on('line', (l) => lines.push(JSON.parse(l)));
  const exit = new Promise<number | null>((resolve) => proc.on('exit', resolve));
  const until = async (cond: () => boolean, what = 'the condition') => {
    for (let i = 0; i < 400 && !cond(); i++) await new Promise((r) => setTimeout(r, 25));
    expect(cond(), what).toBe(true);
  };
  return { proc, lines, exit, until };
}

describe('kvplane serve --engine sim', () => {
  it('serves the simulated engine over ZMQ, gRPC and HTTP (bearer token), logs structured status off a TTY, and stops cleanly on SIGTERM', async () => {
    const config = join(tmpdir(), `kvplane-serve-${process.pid}.json`);
    writeFileSync(
      config,
      JSON.stringify({
        buffer_steps: 500,
        // Every flag has its key: these two had none.
        replay_send_budget_bytes: 4 << 20,
        engine_hwm: 5000,
        topic: 'sim',
        sim: { requests_per_second: 200, seed: 4 },
        http: { port: 0 },
        grpc: { port: 0, host: '127.0.0.1' },
      }),
    );
    const token = 'cli-test-token';
    const { proc, lines, exit, until } = serveSim(config, [], { ...process.env, KVPLANE_AUTH_TOKEN: token });
    await until(() => lines.some((l) => l.msg === 'serving'));
    const serving = lines.find((l) => l.msg === 'serving') as Record<string, string>;
    const sub = new Subscriber();
    sub.connect(serving.endpoint as string);
    sub.subscribe();
    const [topic, seq, payload] = (await sub.receive()) as Buffer[];
    expect(topic?.toString()).toBe('sim');
    expect(seq?.readBigUInt64BE()).toBeGreaterThan(0n);
    expect(decodeBatch(payload as Buffer, 'vllm').events.length).toBeGreaterThan(0);
    sub.close();
    // gRPC SubscribeKvEvents from the next seq: replay then live, as SMG protobuf.
    const Client = makeGenericClientConstructor(subscribeDefinition('sglang.grpc.scheduler.SglangScheduler'), 'kv');
    const client = new Client(`127.0.0.1:${serving.grpc_port}`, credentials.createInsecure());
    const md = new Metadata();
    md.set('authorization', `Bearer ${token}`);
    const first = await new Promise<Buffer>((resolve, reject) => {
      const call = (
        client as unknown as Record<string, (r: Buffer, m: Metadata) => ClientReadableStream<Buffer>>
      ).SubscribeKvEvents?.(
        encodeSubscribeRequest(seq?.readBigUInt64BE() as bigint),
        md,
      ) as ClientReadableStream<Buffer>;
      call.once('data', (b: Buffer) => {
        resolve(b);
        call.cancel();
      });
      call.on('error', (e: { code: number }) => (e.code === 1 ? undefined : reject(e)));
    });
    client.close();
    expect(decodeBatch(first, 'smg_proto').seq).toBe(seq?.readBigUInt64BE());
    expect(decodeBatch(first, 'smg_proto').events).toEqual(decodeBatch(payload as Buffer, 'vllm').events);
    expect((await fetch(`${serving.http}/healthz`)).status).toBe(401);
    const health = await (
      await fetch(`${serving.http}/healthz`, { headers: { authorization: `Bearer ${token}` } })
    ).text();
    expect(JSON.parse(health).status).toBe('ok');
    expect(health).toContain(`"epoch":${serving.epoch}`); // exact u64, as logged
    await until(() => lines.some((l) => l.msg === 'status' && (l.events as number) > 0));
    proc.kill('SIGTERM');
    expect(await exit).toBe(0);
    const stopped = lines.find((l) => l.msg === 'stopped') as Record<string, unknown>;
    expect(stopped).toBeDefined();
    expect(Number(stopped.events)).toBeGreaterThan(0);
  }, 30_000);

  it('rejects unknown flags and engines with ERR_INVALID_ARG and exit code 2', () => {
    for (const args of [
      ['serve', '--engine', 'nope'],
      ['serve', '--bogus', '1'],
      ['serve', '--hwm', 'x'],
      ['serve', '--grpc-tls-cert', 'cert.pem'],
      ['serve', '--auth-token-file', '/nonexistent/token', '--duration', '1'],
      ['indexer', '--node-token-file', '/nonexistent/token', '--duration', '1'],
    ]) {
      const r = spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8' });
      expect(r.status, args.join(' ')).toBe(2);
      expect(r.stderr).toMatch(/ERR_INVALID_ARG/);
    }
    const unknown = spawnSync(process.execPath, [CLI, 'serve', '--engine', 'nope'], { encoding: 'utf8' });
    expect(unknown.stderr).toMatch(/--engine nope: unknown engine; known: sim/);
    const config = join(tmpdir(), `kvplane-serve-engine-${process.pid}.json`);
    writeFileSync(config, JSON.stringify({ engine: 'nope' }));
    const fromFile = spawnSync(process.execPath, [CLI, 'serve', '--config', config], { encoding: 'utf8' });
    expect(fromFile.status).toBe(2);
    expect(fromFile.stderr).toMatch(/unknown engine; known: sim/);
    const help = spawnSync(process.execPath, [CLI, 'serve', '--help'], { encoding: 'utf8' });
    expect(help.stdout).toMatch(/--replay-endpoint/);
    expect(help.stdout).toMatch(/--engine\s+event source: sim \(/);
  });

  /** Runs `kvplane serve` without replay or HTTP until `--duration`; its exit code and log lines. */
  function serveFor(endpoint: string, seconds: number, extra: string[] = []) {
    const r = spawnSync(
      process.execPath,
      [CLI, 'serve', '--endpoint', endpoint, '--replay-endpoint', 'none', '--http-port', 'none', '--duration'].concat([
        String(seconds),
        '--status-interval',
        '10',
        ...extra,
      ]),
      { encoding: 'utf8', timeout: 15_000 },
    );
    const lines = r.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    return { status: r.status, stderr: r.stderr, lines };
  }

  it('runs the default engine (sim) without --engine and stops after --duration with its stats', () => {
    const r = serveFor('tcp://127.0.0.1:*', 0.5, ['--sim-rate', '500']);
    expect(r.status, r.stderr).toBe(0);
    expect(r.lines.find((l) => l.msg === 'serving')?.engine).toBe('sim');
    const stopped = r.lines.find((l) => l.msg === 'stopped') as {
      events: number;
      sim: { steps: number; requests: number };
    };
    expect(stopped.sim.steps).toBeGreaterThan(0);
    expect(stopped.sim.requests).toBeGreaterThan(0);
    expect(stopped.events).toBeGreaterThan(0);
  });

  it('skips its status line while out of file descriptors, keeps serving, and reports again after', async () => {
    const config = join(tmpdir(), `kvplane-serve-fd-${process.pid}.json`);
    writeFileSync(config, JSON.stringify({ http: { port: 0, host: '127.0.0.1' } }));
    // A descriptor limit a connection flood reaches in a moment (the node needs about 40 itself).
    const { proc, lines, exit, until } = serveSim(config, ['prlimit', '--nofile=160:160', '--']);
    try {
      await until(() => lines.some((l) => l.msg === 'serving'), 'serving');
      const url = new URL((lines.find((l) => l.msg === 'serving') as { http: string }).http);
      const flood: Socket[] = [];
      for (let i = 0; i < 200; i++) {
        const c = connect(Number(url.port), '127.0.0.1');
        c.on('error', () => {});
        flood.push(c);
      }
      await until(() => lines.some((l) => l.msg === 'status skipped'), 'a status line skipped');
      expect(lines.find((l) => l.msg === 'status skipped')?.error).toMatch(/EMFILE|too many open files/i);
      for (const c of flood) c.destroy();
      const before = lines.length;
      await until(() => lines.slice(before).some((l) => l.msg === 'status'), 'a status line again');
      expect((await fetch(`${url.origin}/healthz`)).status).toBe(200);
    } finally {
      proc.kill('SIGTERM');
    }
    expect(await exit).toBe(0);
  }, 30_000);

  it('warns when an endpoint will connect rather than serve, naming the bind: form', () => {
    const r = serveFor('tcp://127.0.0.1:9', 0.2);
    expect(r.status, r.stderr).toBe(0);
    const warn = r.lines.find((l) => l.level === 'warn');
    expect(warn).toMatchObject({ msg: 'endpoint connects', endpoint: 'tcp://127.0.0.1:9' });
    expect(warn?.detail).toMatch(/write bind:tcp:\/\/127\.0\.0\.1:9 to serve on it/);
  });
});

describe('kvplane indexer', () => {
  it('follows the workers of --workers (a kvplane node with the simulated engine), serves their blocks, keeps its state file, and stops on SIGTERM', async () => {
    const lines = (proc: ReturnType<typeof spawn>) => {
      const out: Array<Record<string, unknown>> = [];
      createInterface({ input: proc.stdout as NodeJS.ReadableStream }).on('line', (l) => out.push(JSON.parse(l)));
      return out;
    };
    const until = async (cond: () => boolean) => {
      for (let i = 0; i < 400 && !cond(); i++) await new Promise((r) => setTimeout(r, 25));
    };
    const cleanup: Array<() => unknown> = [];
    // A small pool: prompts are evicted and cached again as new chains all along, so an indexer
    // joining a running node (no replay through --workers) sees whole chains soon.
    const node = await serveNode(['--sim-rate', '100', '--sim-blocks', '256'], cleanup);
    const serving = node.serving as { endpoint: string };
    /** `kvplane indexer` on a free port with `args`: its log lines, and its `indexing` line once it serves. */
    const indexer = (args: string[]) => {
      const proc = spawn(process.execPath, [CLI, 'indexer', '--host', '127.0.0.1', '--port', '0', ...args]);
      const out = lines(proc);
      const started = (async () => {
        await until(() => out.some((l) => l.msg === 'indexing'));
        return out.find((l) => l.msg === 'indexing') as Record<string, unknown>;
      })();
      return { proc, out, started };
    };
    const stateFile = join(tmpdir(), `kvplane-indexer-${process.pid}.json`);
    const {
      proc: ix,
      out: ixOut,
      started: ixStarted,
    } = indexer([
      '--block-size',
      '16',
      '--model-name',
      'llama',
      '--workers',
      `7=${serving.endpoint},7:1=${serving.endpoint.replace(/:(\d+)$/, ':1')}`,
      '--state-file',
      stateFile,
    ]);
    const ixExit = new Promise((r) => ix.once('exit', r));
    try {
      const started = await ixStarted;
      expect(started).toMatchObject({ workers: 2, state_file: stateFile });
      const url = started.http as string;
      const workers = (await (await fetch(`${url}/workers?model_name=llama`)).json()) as Array<Record<string, unknown>>;
      expect(workers).toMatchObject([{ instance_id: 7, model_name: 'llama', block_size: 16 }]);
      // The simulated engine's blocks arrive for worker 7.
      let dump: Record<string, { events: Array<{ worker_id: number }> }> = {};
      for (let i = 0; i < 100; i++) {
        dump = (await (await fetch(`${url}/dump`)).json()) as typeof dump;
        if ((dump['llama:default']?.events.length ?? 0) > 0) break;
        await new Promise((r) => setTimeout(r, 50));
      }
      expect(Object.keys(dump)).toEqual(['llama:default']);
      expect(dump['llama:default']?.events.length).toBeGreaterThan(0);
      expect(dump['llama:default']?.events.every((e) => e.worker_id === 7)).toBe(true);
      const saved = JSON.parse(readFileSync(stateFile, 'utf8'));
      expect(
        saved.registrations.map((r: { instance_id: string; dp_rank: number }) => [r.instance_id, r.dp_rank]),
      ).toEqual([
        ['7', 0],
        ['7', 1],
      ]);
      // A second indexer, with the first as its peer (Dynamo's flags): it starts from its dump,
      // says so, and writes its access log.
      const accessLog = join(tmpdir(), `kvplane-access-${process.pid}.log`);
      const peer = indexer([
        '--peers',
        url,
        '--threads',
        '4',
        '--access-log',
        accessLog,
        '--access-log-local-time',
        '--trace-id-header',
        'x-request-id',
        '--duration',
        '20',
      ]);
      cleanup.push(() => peer.proc.kill('SIGTERM'));
      const peerStarted = await peer.started;
      expect(peerStarted).toMatchObject({ peers: [url], recovered_from: url });
      const recovered = peerStarted.recovered as Array<{ name: string; blocks: number }>;
      expect(recovered.map((r) => r.name)).toEqual(['llama:default']);
      expect(recovered[0]?.blocks).toBeGreaterThan(0);
      const peerUrl = peerStarted.http as string;
      await fetch(`${peerUrl}/peers`, { headers: { 'x-request-id': 'r-1' } }).then((r) => r.json());
      let logged = '';
      for (let i = 0; i < 100 && logged === ''; i++) {
        logged = existsSync(accessLog) ? readFileSync(accessLog, 'utf8') : '';
        if (logged === '') await new Promise((r) => setTimeout(r, 25));
      }
      expect(JSON.parse(logged.trim())).toMatchObject({ trace_id: 'r-1', method: 'GET', path: '/peers', status: 200 });
      expect(JSON.parse(logged.trim()).ts).toMatch(/[+-]\d\d:\d\d$/);
    } finally {
      ix.kill('SIGTERM');
      for (const f of cleanup) await f();
    }
    expect(await ixExit).toBe(0);
    expect(ixOut.some((l) => l.msg === 'stopping')).toBe(true);
  }, 30_000);

  it('rejects bad flags with ERR_INVALID_ARG and exit code 2', () => {
    for (const args of [
      ['--workers', '1=tcp://h:1'],
      ['--port', 'x'],
      ['--nope', '1'],
      ['--block-size', '16', '--workers', 'x'],
      ['--peers', 'ftp://idx:1'],
      ['--threads', '0'],
      ['--access-log-local-time=yes'],
      ['--trace-id-header', 'a b'],
    ]) {
      const r = spawnSync(process.execPath, [CLI, 'indexer', ...args], { encoding: 'utf8' });
      expect(r.status, args.join(' ')).toBe(2);
      expect(r.stderr).toMatch(/ERR_INVALID_ARG/);
    }
  });
});
