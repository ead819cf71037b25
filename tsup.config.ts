import { defineConfig } from 'tsup';

// One build of the library, CommonJS. The ES module entry (dist/index.mjs, written by
// scripts/esm_entry.mjs after this build) re-exports it, so both module systems share one copy of
// every class: an error thrown through one passes `instanceof` in the other.

export default defineConfig([
  {
    entry: ['src/index.ts'],
    format: ['cjs'],
    dts: true,
    clean: true,
    target: 'node20',
    shims: true,
    // The napi loader at the package root picks the platform binary at run time: never bundle it.
    external: ['../index.js'],
  },
  {
    entry: { cli: 'src/cli/main.ts' },
    format: ['cjs'],
    target: 'node20',
    shims: true,
    external: ['../index.js'],
  },
]);
