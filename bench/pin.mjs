// Runs the calling bench again pinned to one CPU (these VMs' vCPUs differ in speed) with
// --expose-gc for memory readings, then exits with its status. Returns the CPU in the child.
import { execFileSync } from 'node:child_process';

export function pinToOneCpu() {
  const cpu = process.env.BENCH_CPU ?? '0';
  if (process.env.KVPLANE_BENCH_PINNED) return cpu;
  try {
    execFileSync(
      'taskset',
      ['-c', cpu, process.execPath, '--expose-gc', '--max-old-space-size=16384', ...process.argv.slice(1)],
      { stdio: 'inherit', env: { ...process.env, KVPLANE_BENCH_PINNED: '1' } },
    );
    process.exit(0);
  } catch (err) {
    process.exit(err.status ?? 1);
  }
}
