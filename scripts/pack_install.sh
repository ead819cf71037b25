#!/usr/bin/env bash
# The published install path, as a user meets it: the root package and its linux-x64-gnu binary
# package packed the way the release workflow publishes them (napi create-npm-dirs, napi
# prepublish), installed from their tarballs into an empty project, then loaded with require,
# import, `tsc --strict` and `npx kvplane serve`. Run after `npm run build`; `.ci/run` runs it.
# Prints the installed size (the figure in the README).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
napi="$repo/node_modules/.bin/napi"
tsc="$repo/node_modules/.bin/tsc"
binary=kvplane.linux-x64-gnu.node
[ -f "$repo/$binary" ] || { echo "pack_install: $binary missing: run npm run build first" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
stage="$work/stage"
proj="$work/project"
mkdir -p "$stage" "$proj"

echo "== stage the package (one target: linux-x64-gnu)"
(cd "$repo" && cp -r package.json index.js index.d.ts dist proto LICENSE README.md "$stage/")
node -e '
  const fs = require("fs"); const p = process.argv[1];
  const pkg = JSON.parse(fs.readFileSync(p, "utf8"));
  pkg.napi.targets = ["x86_64-unknown-linux-gnu"];
  fs.writeFileSync(p, JSON.stringify(pkg, null, 2));
' "$stage/package.json"
cd "$stage"
"$napi" create-npm-dirs >/dev/null
cp "$repo/$binary" npm/linux-x64-gnu/
"$napi" prepublish -t npm --skip-optional-publish --no-gh-release --dry-run
"$napi" prepublish -t npm --skip-optional-publish --no-gh-release >/dev/null
node -e '
  const pkg = require(process.argv[1]);
  const want = "@kvplane/binding-linux-x64-gnu";
  if (pkg.optionalDependencies?.[want] !== pkg.version) {
    console.error("prepublish did not list", want, "as an optional dependency:", pkg.optionalDependencies);
    process.exit(1);
  }
' "$stage/package.json"
root_tgz="$stage/$(npm pack --silent)"
binding_tgz="$stage/npm/linux-x64-gnu/$(cd npm/linux-x64-gnu && npm pack --silent)"
contents="$(tar -tzf "$root_tgz")"
grep -qx 'package/LICENSE' <<<"$contents" || { echo "pack_install: LICENSE not in the tarball" >&2; exit 1; }
if grep -q '\.node$' <<<"$contents"; then
  echo "pack_install: the root tarball carries a .node file" >&2
  exit 1
fi

echo "== install both tarballs into an empty project"
cd "$proj"
npm init -y >/dev/null
npm install --no-audit --no-fund --loglevel=error "$root_tgz" "$binding_tgz"
echo "installed without the optional transports: $(du -sk node_modules | cut -f1) KiB in node_modules"

echo "== hashing, the router index with a live-only subscription and a live-only publisher need no transport package"
node -e '
  const k = require("kvplane");
  for (const peer of ["zeromq", "@grpc/grpc-js"]) {
    try { require.resolve(peer); throw new Error(peer + " was installed") } catch (e) { if (e.code !== "MODULE_NOT_FOUND") throw e; }
  }
  const index = new k.RouterIndex({ blockSize: 2 });
  const m = index.findMatches([1, 2, 3, 4], { loraName: null, cacheSalt: null });
  if (m.workerIds.length !== 0) throw new Error("an empty index matched");
  // A ZMQ subscription reads its live stream natively; its replay fetches are zeromq.js.
  const live = index.subscribe(1n, { kind: "zmq", endpoint: "tcp://127.0.0.1:9" });
  try {
    index.subscribe(2n, { kind: "zmq", endpoint: "tcp://127.0.0.1:9", replayEndpoint: "tcp://127.0.0.1:10" });
    throw new Error("a subscription with replay opened without zeromq");
  } catch (e) {
    if (e.code !== "ERR_MISSING_DEPENDENCY") throw e;
  }
  if (index.subscriptionStats().length !== 1 || live.workerId !== 1n) throw new Error("subscriptions: " + index.subscriptionStats().length);
  // The live socket binds natively; the replay ROUTER is zeromq.js.
  index
    .close()
    .then(() => k.KvEventPublisher.create({ endpoint: "tcp://127.0.0.1:*", replayEndpoint: null }))
    .then((live) => live.close())
    .then(() => k.KvEventPublisher.create({ endpoint: "tcp://127.0.0.1:*", replayEndpoint: "tcp://127.0.0.1:*" }))
    .then(
      () => { throw new Error("a publisher with replay opened without zeromq") },
      (e) => {
        if (e.code !== "ERR_MISSING_DEPENDENCY" || !e.message.includes("npm install zeromq")) throw e;
        console.log("without transports: hashing, RouterIndex, a live-only subscription and publisher ok; replay asks for zeromq");
      },
    );
'
peers="$(node -p 'const p = require(process.argv[1]).peerDependencies; Object.entries(p).map(([n, v]) => n + "@" + v).join(" ")' "$stage/package.json")"
npm install --no-audit --no-fund --loglevel=error $peers
echo "installed with the transports ($peers): $(du -sk node_modules | cut -f1) KiB in node_modules"

echo "== require, import, tsc --strict"
node -e '
  const k = require("kvplane");
  const h = k.hashBlocks([1, 2, 3, 4], { blockSize: 2 });
  if (h.length !== 2) throw new Error("hashBlocks gave " + h.length);
  const binding = require.resolve("@kvplane/binding-linux-x64-gnu");
  if (!binding.includes("node_modules/@kvplane/binding-linux-x64-gnu/")) throw new Error(binding);
  console.log("require: ok, binding from", binding.replace(process.cwd() + "/", ""));
'
node --input-type=module -e '
  import { createRequire } from "node:module";
  import { KvPlaneError, hashBlocks } from "kvplane";
  const cjs = createRequire(import.meta.url)("kvplane");
  if (KvPlaneError !== cjs.KvPlaneError) throw new Error("two KvPlaneError classes");
  try { hashBlocks([1], { blockSize: 0 }); throw new Error("no error"); }
  catch (e) { if (!(e instanceof cjs.KvPlaneError) || e.code !== "ERR_INVALID_ARG") throw e; }
  console.log("import: ok");
'
cat > check.ts <<'EOF'
import { hashBlocks, KvPlaneError, RouterIndex } from 'kvplane';

const hashes: BigUint64Array | bigint[] = hashBlocks([1, 2, 3, 4], { blockSize: 2 });
const index = new RouterIndex({ blockSize: 2 });
const err: KvPlaneError = new KvPlaneError('ERR_INVALID_ARG', 'typed');
console.log(hashes.length, typeof index, err.code);
EOF
cat > tsconfig.json <<'EOF'
{ "compilerOptions": { "strict": true, "noEmit": true, "module": "node16", "moduleResolution": "node16", "target": "es2022", "types": ["node"] }, "files": ["check.ts"] }
EOF
# A TypeScript project on Node has Node's types (the API speaks Buffer).
npm install --no-audit --no-fund --loglevel=error --save-dev "@types/node@$(node -p 'require(process.argv[1]).devDependencies["@types/node"]' "$repo/package.json")"
"$tsc" -p tsconfig.json
echo "tsc --strict: ok"

echo "== npx kvplane serve --duration 2"
npx --no-install kvplane serve --engine sim --duration 2 --endpoint tcp://127.0.0.1:0 \
  --replay-endpoint none --http-port none --status-interval 10 >serve.log 2>&1 || { cat serve.log; exit 1; }
echo "serve: ok"
