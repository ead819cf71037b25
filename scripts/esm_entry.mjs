// Writes the package's ES module entry over its CommonJS build (see tsup.config.ts): one copy of
// the library for both module systems.
import { writeFileSync } from 'node:fs';

const entry = "export * from './index.js';\n";
writeFileSync(new URL('../dist/index.mjs', import.meta.url), entry);
writeFileSync(new URL('../dist/index.d.mts', import.meta.url), entry);
