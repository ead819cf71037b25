import { type ChildProcess, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { repoPath } from './fixtures.js';

/**
 * A real engine's KV-event publisher (scripts/engine_peer.py: vLLM's or SGLang's own
 * ZmqEventPublisher from their wheels), driven by JSON commands; stopped by `cleanup`.
 */
export type Engine = 'vllm' | 'sglang';

export interface EnginePeer {
  endpoint: string;
  replay: string | null;
  /** Sends one command and waits for its answer. */
  run(cmd: Record<string, unknown>): Promise<void>;
  /** Shuts the engine's publishers down and waits for the process to exit. */
  exit(): Promise<void>;
}

export async function enginePeer(
  cleanup: Array<() => unknown>,
  engine: Engine,
  ...args: string[]
): Promise<EnginePeer> {
  const proc: ChildProcess = spawn('python3', [repoPath('scripts/engine_peer.py'), engine, ...args], {
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let stderr = '';
  proc.stderr?.on('data', (d) => {
    stderr += d;
  });
  const exited = new Promise<void>((r) => proc.once('exit', () => r()));
  const lines = createInterface({ input: proc.stdout as NodeJS.ReadableStream })[Symbol.asyncIterator]();
  const next = async (): Promise<Record<string, unknown>> => {
    const line = await lines.next();
    if (line.done) throw new Error(`engine_peer.py ${engine} exited: ${stderr}`);
    return JSON.parse(line.value) as Record<string, unknown>;
  };
  const ready = await next();
  let open = true;
  const peer: EnginePeer = {
    endpoint: ready.endpoint as string,
    replay: ready.replay as string | null,
    async run(cmd) {
      proc.stdin?.write(`${JSON.stringify(cmd)}\n`);
      const answer = await next();
      if (answer.ok !== true) throw new Error(`engine_peer.py ${JSON.stringify(cmd)}: ${JSON.stringify(answer)}`);
    },
    async exit() {
      if (!open) return;
      open = false;
      await peer.run({ op: 'exit' });
      await exited;
    },
  };
  cleanup.push(async () => {
    if (open) proc.kill('SIGKILL');
    await exited;
  });
  return peer;
}

/**
 * Stops `peer` and starts the engine again with `args` on the same ports (numbering from 0, its
 * cache empty), after `stopped` resolves.
 */
export async function restartEnginePeer(
  cleanup: Array<() => unknown>,
  engine: Engine,
  peer: EnginePeer,
  args: string[],
  stopped?: () => Promise<void>,
): Promise<EnginePeer> {
  await peer.exit();
  await stopped?.();
  const port = (e: string) => new URL(e.replace('tcp://', 'http://')).port;
  return enginePeer(
    cleanup,
    engine,
    ...args,
    '--port',
    port(peer.endpoint),
    '--replay-port',
    port(peer.replay as string),
  );
}
