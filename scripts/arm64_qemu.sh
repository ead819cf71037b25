#!/usr/bin/env bash
# The aarch64-unknown-linux-gnu binary, built here and proven here: cross-built with Debian's
# gcc-aarch64-linux-gnu linker, then loaded by an arm64 Node taken from Debian's arm64 packages
# (downloaded and extracted into a private sysroot; nothing is installed over the host's Node)
# and run under qemu-user, where it must compute the same block hashes as the x64 build.
#
# Needs root (apt) and the Rust target from rustup. `.ci/run` runs it with KVPLANE_CI_FULL=1 (it
# adds about 7 minutes on 2 cores). Run after `npm run build` (the x64 side of the comparison).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
work="${KVPLANE_ARM64_DIR:-$repo/target/arm64-qemu}"
sysroot="$work/sysroot"
out="$work/out"
mkdir -p "$work/debs" "$sysroot" "$out"

echo "== cross toolchain and qemu (Debian)"
export DEBIAN_FRONTEND=noninteractive
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  apt-get update -q >/dev/null
  apt-get install -y -q gcc-aarch64-linux-gnu qemu-user >/dev/null
fi
rustup target add aarch64-unknown-linux-gnu >/dev/null

echo "== arm64 Node from Debian's arm64 packages, into $sysroot"
if [ ! -x "$sysroot/usr/bin/node" ]; then
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    dpkg --add-architecture arm64
  fi
  apt-get update -q >/dev/null
  (cd "$work/debs" && apt-get download -q \
    nodejs:arm64 libnode108:arm64 libc6:arm64 libgcc-s1:arm64 libstdc++6:arm64 libicu72:arm64 \
    libuv1:arm64 libssl3:arm64 libbrotli1:arm64 libc-ares2:arm64 libnghttp2-14:arm64 zlib1g:arm64 \
    node-acorn node-cjs-module-lexer node-undici 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
  for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$sysroot"; done
fi
arm_node=(qemu-aarch64 -L "$sysroot" "$sysroot/usr/bin/node")
echo "arm64 node: $("${arm_node[@]}" -p 'process.arch + " " + process.version')"

echo "== cross build (aarch64-unknown-linux-gnu)"
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar \
  npx napi build --platform --release --target aarch64-unknown-linux-gnu \
    --manifest-path crates/kvplane-node/Cargo.toml --package-json-path package.json \
    --output-dir "$out" --js index.js --dts index.d.ts
file "$out/kvplane.linux-arm64-gnu.node" | grep -q 'ARM aarch64' || { echo "arm64_qemu: not an aarch64 binary" >&2; exit 1; }

echo "== load under qemu and compare hashes with x64"
"${arm_node[@]}" scripts/arch_hashes.cjs "$out/index.js" >"$work/arm64.json"
node scripts/arch_hashes.cjs index.js >"$work/x64.json"
node -e '
  const [a, x] = process.argv.slice(1).map((f) => JSON.parse(require("fs").readFileSync(f, "utf8")));
  if (a.arch !== "arm64" || x.arch !== "x64") throw new Error(`arches ${a.arch} / ${x.arch}`);
  if (JSON.stringify(a.hashes) !== JSON.stringify(x.hashes)) { console.error("arm64 and x64 hashes differ"); process.exit(1); }
  const n = a.hashes.reduce((s, c) => s + c[3].length, 0);
  console.log(`arm64 under qemu: the same ${n} block hashes as x64 (${a.hashes.length} inputs)`);
' "$work/arm64.json" "$work/x64.json"
