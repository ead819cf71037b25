import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { KvPlaneError, toKvPlaneError } from '../src/errors.js';
import native from '../src/native.js';
import { repoPath } from './fixtures.js';

describe('panic safety', () => {
  it('turns a Rust panic into an ERR_INTERNAL error instead of aborting', () => {
    let caught: KvPlaneError | undefined;
    try {
      native.panicProbe('boom');
    } catch (err) {
      caught = toKvPlaneError(err);
    }
    expect(caught).toBeInstanceOf(KvPlaneError);
    expect(caught?.code).toBe('ERR_INTERNAL');
    expect(caught?.message).toContain('boom');
  });

  it('keeps the process alive after a panic', () => {
    // A separate Node process panics through the binding, then keeps working and exits cleanly.
    const script = `
      const native = require(${JSON.stringify(repoPath('index.js'))});
      try { native.panicProbe('first'); } catch (e) { console.log('caught', e.code); }
      console.log('hashes', native.hashBlocks([1, 2, 3, 4], { blockSize: 2 }).length);
    `;
    const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8' });
    expect(r.status).toBe(0);
    expect(r.stdout).toContain('caught ERR_INTERNAL');
    expect(r.stdout).toContain('hashes 2');
  });
});
