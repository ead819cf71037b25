import { KvPlaneError } from '../errors.js';
import type { SimEngineOptions } from './sim/engine.js';
import { SimSource } from './sim/source.js';
import type { EventSource } from './source.js';

/** What `kvplane serve` hands a source factory: the node's block size and the source's settings. */
export interface SourceSettings {
  blockSize?: number;
  /** The simulated engine's settings (`--sim-*`, the config file's `sim` section). */
  sim: SimEngineOptions;
}

export interface SourceEntry {
  /** One line for `kvplane serve --help`. */
  help: string;
  create(settings: SourceSettings): EventSource;
}

/** Every source `kvplane serve --engine NAME` can run, by name. */
export const SOURCES: Readonly<Record<string, SourceEntry>> = {
  sim: {
    help: 'the built-in simulated engine',
    create: (s) => new SimSource({ blockSize: s.blockSize, ...s.sim }),
  },
};

export function sourceNames(): string[] {
  return Object.keys(SOURCES);
}

/** Checks a source name against the registry. */
export function checkSourceName(name: string): string {
  if (!Object.hasOwn(SOURCES, name)) {
    throw new KvPlaneError('ERR_INVALID_ARG', `--engine ${name}: unknown engine; known: ${sourceNames().join(', ')}`);
  }
  return name;
}

/** Creates the named source. */
export function createSource(name: string, settings: SourceSettings): EventSource {
  return (SOURCES[checkSourceName(name)] as SourceEntry).create(settings);
}
