import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * The test run's temporary files (state files, ipc sockets, certificates, tokenizers) go in one
 * directory of their own, removed when the run ends: the test workers and what they spawn take it
 * as TMPDIR.
 */
export default function setup(): () => void {
  const dir = mkdtempSync(join(tmpdir(), 'kvplane-test-'));
  process.env.TMPDIR = dir;
  return () => rmSync(dir, { recursive: true, force: true });
}
