import { defineConfig } from 'tsup';

export default defineConfig([
  {
    entry: ['src/index.ts'],
    format: ['esm', 'cjs'],
    dts: true,
    clean: true,
    target: 'node20',
    // The napi loader at the package root picks the platform binary at run time: never bundle it.
    external: ['../index.js'],
  },
  {
    entry: { cli: 'src/cli/main.ts' },
    format: ['cjs'],
    target: 'node20',
    external: ['../index.js'],
  },
]);
