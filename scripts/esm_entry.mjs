// Writes the package's ES module entry over its CommonJS build (see tsup.config.ts): one copy of
// the library for both module systems.
//
// The names are listed, not `export *`: from Node 23 on, an ES import of a CommonJS module also
// has a `module.exports` export, which `export *` would pass on. They are read from the build's
// own export table (tsup's `__export(index_exports, { NAME: () => NAME, ... })`) without loading
// it: the publish job builds the TS with no native binary beside it.
import { readFileSync, writeFileSync } from 'node:fs';

const cjs = readFileSync(new URL('../dist/index.js', import.meta.url), 'utf8');
const table = /__export\(\w+, \{\n([^}]*)\}\);/.exec(cjs);
const names = [...(table?.[1] ?? '').matchAll(/^\s*(\w+): \(\) => \1,?$/gm)].map((m) => m[1]);
if (names.length === 0) throw new Error('esm_entry: no export table found in dist/index.js');
const entry = `export {\n${names.map((n) => `  ${n},\n`).join('')}} from './index.js';\n`;
writeFileSync(new URL('../dist/index.mjs', import.meta.url), entry);
// Types: every export, types included, as TypeScript sees the CommonJS declarations.
writeFileSync(new URL('../dist/index.d.mts', import.meta.url), "export * from './index.js';\n");
console.log(`esm_entry: ${names.length} names`);
