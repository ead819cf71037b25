import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { repoPath } from './fixtures.js';

/** Runs `script` in a fresh Node process, whose environment decides whether the hooks attach. */
function runNode(script: string, env: Record<string, string | undefined>) {
  return spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', env: { ...process.env, ...env } });
}

const loader = JSON.stringify(repoPath('index.js'));
const packageEntry = JSON.stringify(repoPath('dist/index.js'));
const binary = JSON.stringify(repoPath(readdirSync(repoPath('.')).find((f) => /^kvplane\..+\.node$/.test(f)) ?? ''));

describe('panic safety', () => {
  it('turns a Rust panic into an ERR_INTERNAL error and keeps the process alive', () => {
    // panicProbe is a test hook: the binary attaches it only when KVPLANE_TEST_HOOKS=1 at load.
    const script = `
      const native = require(${loader});
      try { native.panicProbe('boom'); } catch (e) { console.log('caught', e.code, e.message); }
      console.log('hashes', native.hashBlocks(new Uint32Array([1, 2, 3, 4]), { blockSize: 2 }).length);
    `;
    const r = runNode(script, { KVPLANE_TEST_HOOKS: '1', RUST_BACKTRACE: '0' });
    expect(r.status).toBe(0);
    expect(r.stdout).toMatch(/caught ERR_INTERNAL panic in kvplane core: .*boom/);
    expect(r.stdout).toContain('hashes 2');
  });

  it('keeps the hook out of the loader, the binary and the typings without KVPLANE_TEST_HOOKS', () => {
    const script = `
      console.log('loader', typeof require(${loader}).panicProbe);
      console.log('binary', typeof require(${binary}).panicProbe);
      console.log('package', typeof require(${packageEntry}).panicProbe);
    `;
    const r = runNode(script, { KVPLANE_TEST_HOOKS: undefined });
    expect(r.status).toBe(0);
    expect(r.stdout).toContain('loader undefined');
    expect(r.stdout).toContain('binary undefined');
    expect(r.stdout).toContain('package undefined');
    expect(readFileSync(repoPath('index.d.ts'), 'utf8')).not.toContain('panicProbe');
  });
});
