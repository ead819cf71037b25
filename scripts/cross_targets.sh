#!/usr/bin/env bash
# The release targets other than linux-x64-gnu, from this machine (`.ci/run` with
# KVPLANE_CI_FULL=1): aarch64 glibc built and run under qemu (scripts/arm64_qemu.sh), and the two
# musl targets cross-built with zig (PyPI `ziglang`, `cargo-zigbuild`), as the release workflow
# builds them. The musl binaries then run under a musl Node (x64 natively, arm64 under qemu) and
# must compute the same block hashes as x64 glibc (scripts/musl_node.sh).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

bash scripts/arm64_qemu.sh

echo "== musl targets with zig"
out="$repo/target/musl-zig"
mkdir -p "$out"
python3 -m pip install --quiet --disable-pip-version-check ziglang
command -v cargo-zigbuild >/dev/null || cargo install --locked --quiet cargo-zigbuild
rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl >/dev/null
for target in x86_64-unknown-linux-musl aarch64-unknown-linux-musl; do
  npx napi build --platform --release --target "$target" --cross-compile \
    --manifest-path crates/kvplane-node/Cargo.toml --package-json-path package.json \
    --output-dir "$out" --no-js --dts index.d.ts
done
file "$out/kvplane.linux-x64-musl.node" | grep -q 'x86-64' || { echo "cross_targets: x64 musl binary missing" >&2; exit 1; }
file "$out/kvplane.linux-arm64-musl.node" | grep -q 'ARM aarch64' || { echo "cross_targets: arm64 musl binary missing" >&2; exit 1; }
ls -l "$out"/kvplane.*.node

bash scripts/musl_node.sh "$out"
