import { createRequire } from 'node:module';
import { KvPlaneError } from './errors.js';

type Native = typeof import('../index.js');

/**
 * The generated napi loader (index.js at the package root), which picks the binary for this
 * platform. A platform with no binary, or a binary that does not load, is `ERR_NATIVE_LOAD`
 * naming the platform.
 */
function load(): Native {
  try {
    return createRequire(import.meta.url)('../index.js') as Native;
  } catch (err) {
    const libc = process.platform === 'linux' ? `-${linuxLibc()}` : '';
    throw new KvPlaneError(
      'ERR_NATIVE_LOAD',
      `kvplane has no native binary that loads on ${process.platform}-${process.arch}${libc} (it ships ` +
        'linux-x64-gnu, linux-x64-musl, linux-arm64-gnu and linux-arm64-musl, installed as the optional ' +
        `package @kvplane/binding-<platform>): ${(err as Error).message ?? err}`,
      { cause: err },
    );
  }
}

function linuxLibc(): string {
  const report = process.report?.getReport() as { header?: { glibcVersionRuntime?: string } } | undefined;
  return report?.header?.glibcVersionRuntime ? 'gnu' : 'musl';
}

const native: Native = load();

export default native;
