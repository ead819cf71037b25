#!/usr/bin/env python3
"""Generate golden block-hash fixtures (fixtures/hashes.json) for kvplane.

Every algorithm of SPEC section 4 is computed here from reference code:

* the libraries the engines themselves use (hashlib, pickle, cbor2, xxhash,
  blake3), driven by small reimplementations written for this script; and,
  with --engine (or KVPLANE_FIXTURES_ENGINE=1),
* the engines' own functions, pulled out of their published wheels at run time:
  vLLM's hash_block_tokens / init_none_hash / hash functions and SGLang's
  get_hash_str / hash_str_to_int64 (plus its native hash extension, compiled
  from the C++ source shipped in the wheel). Only the named functions are
  parsed out with `ast` and executed, so neither engine (nor torch) is
  imported. Wheels and build products are cached under .cache/hash-fixtures/.

Whenever engine code is loaded, each case is computed both ways and the results
must be identical (asserted). The generator also asserts that it reproduces
every case of shared/vectors/hashes.json when that file is found.

Usage:
    python3 scripts/gen_hash_fixtures.py            # write fixtures/hashes.json
    python3 scripts/gen_hash_fixtures.py --engine   # same, with engine code
    python3 scripts/gen_hash_fixtures.py --check    # exit 1 if the file is stale

--check regenerates in memory and compares with the committed file. The
"references" block (which implementation produced each algorithm) is allowed to
differ when the committed file was made with --engine and the check runs
without it: the cases themselves must match byte for byte.
"""

from __future__ import annotations

import __future__ as _future
import argparse
import ast
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pickle
import pickletools
import platform
import random
import shutil
import struct
import subprocess
import sys
import sysconfig
import types
import zipfile
from array import array
from pathlib import Path
from typing import Any, NewType, Optional, Sequence

import blake3
import cbor2
import xxhash

REPO = Path(__file__).resolve().parent.parent
OUT_PATH = REPO / "fixtures" / "hashes.json"
GENERATOR = "scripts/gen_hash_fixtures.py"
CACHE_DIR = Path(os.environ.get("KVPLANE_FIXTURES_CACHE", REPO / ".cache" / "hash-fixtures"))
SHARED_DIR = Path(os.environ.get("KVPLANE_SHARED_DIR", REPO.parent / "shared"))

# Engine releases whose code is used with --engine (override with flags).
VLLM_VERSION = "0.33.0"
SGLANG_VERSION = "0.5.23"

MASK32 = (1 << 32) - 1
MASK64 = (1 << 64) - 1
XXH3_SEED = 1337
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL  # what vLLM passes; 5 on CPython 3.8+

# TRT-LLM cache_salt -> salt id. The brief (and released TRT-LLM's LLM API /
# kv_cache_hash.get_cache_salt_id) use BLAKE3; SPEC.md section 4 says SHA-256
# (TRT-LLM's KV cache manager V2 derivation). See fixtures/README.md.
TRT_SALT_ID_HASH = "sha256"  # docs/protocol.md#block-hashing; older TRT-LLM routers used "blake3"

ALGOS = [
    "xxh3",
    "xxh3_content",
    "vllm_sha256",
    "vllm_sha256_cbor",
    "vllm_xxhash",
    "vllm_xxhash_cbor",
    "sglang_sha256",
    "trtllm_v1_block_key",
    "trtllm_v2_sha256",
]
VLLM_ALGOS = {
    # algo: (serializer, digest, vLLM hash function name)
    "vllm_sha256": ("pickle", "sha256", "sha256"),
    "vllm_sha256_cbor": ("cbor", "sha256", "sha256_cbor"),
    "vllm_xxhash": ("pickle", "xxh3_128", "xxhash"),
    "vllm_xxhash_cbor": ("cbor", "xxh3_128", "xxhash_cbor"),
}
DIGEST_ALGOS = set(VLLM_ALGOS) | {"sglang_sha256", "trtllm_v2_sha256"}


def log(msg: str) -> None:
    print(f"[gen_hash_fixtures] {msg}", file=sys.stderr)


# --------------------------------------------------------------------------
# Library reimplementations (written for kvplane; constants from the engines)
# --------------------------------------------------------------------------


def pack_u32(tokens: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}I", *tokens)


def full_blocks(tokens: Sequence[int], block_size: int) -> list[list[int]]:
    assert block_size >= 1
    n = len(tokens) // block_size
    return [list(tokens[i * block_size:(i + 1) * block_size]) for i in range(n)]


def lib_xxh3_content(tokens, block_size) -> list[int]:
    return [xxhash.xxh3_64_intdigest(pack_u32(b), seed=XXH3_SEED)
            for b in full_blocks(tokens, block_size)]


def lib_xxh3(tokens, block_size, parent: Optional[int] = None) -> list[int]:
    out, prev = [], parent
    for content in lib_xxh3_content(tokens, block_size):
        if prev is None:
            h = content
        else:
            h = xxhash.xxh3_64_intdigest(struct.pack("<QQ", prev, content), seed=XXH3_SEED)
        out.append(h)
        prev = h
    return out


def _serialize(kind: str, obj: Any) -> bytes:
    if kind == "pickle":
        return pickle.dumps(obj, protocol=PICKLE_PROTOCOL)
    return cbor2.dumps(obj, canonical=True)


def _digest(kind: str, data: bytes) -> bytes:
    if kind == "sha256":
        return hashlib.sha256(data).digest()
    return xxhash.xxh3_128_digest(data)


def lib_vllm_hash_fn(algo: str):
    ser, dig, _ = VLLM_ALGOS[algo]
    return lambda obj: _digest(dig, _serialize(ser, obj))


def vllm_block_extra_keys(block_index: int, lora_name, extra_keys, cache_salt, has_parent,
                          first_block_extra_keys=None):
    """Extra keys of one block, in vLLM's order: LoRA, caller keys, then (request's first block
    only) the salt and the caller's first-block keys (vLLM >= 0.33 tags its salt that way)."""
    keys: list[Any] = []
    if lora_name:
        keys.append(lora_name)
    keys.extend(extra_keys or ())
    if block_index == 0 and not has_parent:
        if cache_salt:
            keys.append(cache_salt)
        keys.extend(first_block_extra_keys or ())
    return tuple(keys) if keys else None


def vllm_u64(digest: bytes) -> int:
    return int.from_bytes(digest[-8:], "big")


def lib_vllm(algo, tokens, block_size, none_hash_seed=None, parent_bytes=None,
             lora_name=None, cache_salt=None, extra_keys=None,
             first_block_extra_keys=None) -> list[bytes]:
    hash_fn = lib_vllm_hash_fn(algo)
    if parent_bytes is not None:
        prev = parent_bytes
    else:
        seed = none_hash_seed if none_hash_seed is not None else DEFAULT_NONE_HASH_SEED
        prev = hash_fn(seed)
    out = []
    for i, block in enumerate(full_blocks(tokens, block_size)):
        extra = vllm_block_extra_keys(i, lora_name, extra_keys, cache_salt, parent_bytes is not None,
                                      first_block_extra_keys)
        prev = hash_fn((prev, tuple(block), extra))
        out.append(prev)
    return out


SGLANG_SALT_PREFIX = b"sglang-cache-salt-v1\0"


def sglang_salt_root(cache_salt: Optional[str]) -> Optional[bytes]:
    """SGLang seeds a salted request's event hash chain with this digest as the prior hash."""
    return hashlib.sha256(SGLANG_SALT_PREFIX + cache_salt.encode()).digest() if cache_salt else None


def lib_sglang(tokens, block_size, parent_bytes=None) -> list[bytes]:
    out, prev = [], parent_bytes
    for block in full_blocks(tokens, block_size):
        h = hashlib.sha256()
        if prev is not None:
            h.update(prev)
        h.update(pack_u32(block))
        prev = h.digest()
        out.append(prev)
    return out


def sglang_signed(u64: int) -> int:
    return u64 - (1 << 64) if u64 >= (1 << 63) else u64


def trt_mix32(value: int, seed: int) -> int:
    v = value & MASK32
    v = (((v >> 16) ^ v) * 0x45D9F3B) & MASK32
    v = (((v >> 16) ^ v) * 0x45D9F3B) & MASK32
    v = ((v >> 16) ^ v) & MASK32
    v = (v + 0x9E3779B9) & MASK32
    return seed ^ ((v + ((seed << 6) & MASK64) + (seed >> 2)) & MASK64)


def trt_mix64(value: int, seed: int) -> int:
    v = value & MASK64
    v = ((v ^ (v >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    v = ((v ^ (v >> 27)) * 0x94D049BB133111EB) & MASK64
    v ^= v >> 31
    return seed ^ ((v + 0x9E3779B9 + ((seed << 6) & MASK64) + (seed >> 2)) & MASK64)


def trt_salt_id(salt: str, how: str = "") -> int:
    data = salt.encode("utf-8")
    if (how or TRT_SALT_ID_HASH) == "blake3":
        raw = blake3.blake3(data).digest(length=8)
    else:
        raw = hashlib.sha256(data).digest()[:8]
    return int.from_bytes(raw, "little")


def lib_trtllm_v1(tokens, block_size, parent=0, lora_id=None, salt_id=None) -> list[int]:
    out, prev = [], parent
    for block in full_blocks(tokens, block_size):
        seed = (len(block) ^ ((prev * 0xBF58476D1CE4E5B9) & MASK64)) & MASK64
        if prev == 0 and salt_id is not None:
            seed = trt_mix64(salt_id, seed)
        for t in block:
            seed = trt_mix32(t, seed)
        if lora_id is not None:
            seed = trt_mix64(lora_id, seed)
        out.append(seed)
        prev = seed
    return out


def trtllm_v2_root(lora_id=None, salt_id=None) -> bytes:
    mask = (1 if lora_id is not None else 0) | (2 if salt_id is not None else 0)
    data = bytes([mask])
    for v in (lora_id, salt_id):
        if v is not None:
            data += struct.pack("<Q", v)
    return hashlib.sha256(data).digest()


def lib_trtllm_v2(tokens, block_size, parent_bytes=None, lora_id=None, salt_id=None) -> list[bytes]:
    prev = parent_bytes if parent_bytes is not None else trtllm_v2_root(lora_id, salt_id)
    out = []
    for block in full_blocks(tokens, block_size):
        prev = hashlib.sha256(prev + pack_u32(block)).digest()
        out.append(prev)
    return out


# --------------------------------------------------------------------------
# Engine code, extracted from the published wheels at run time
# --------------------------------------------------------------------------


class EngineUnavailable(Exception):
    pass


def fetch_wheel(name: str, version: str) -> Path:
    dest = CACHE_DIR / "wheels" / f"{name}-{version}"
    norm = name.replace("-", "_")
    found = sorted(dest.glob(f"{norm}-{version}-*.whl")) if dest.is_dir() else []
    if not found:
        dest.mkdir(parents=True, exist_ok=True)
        log(f"downloading {name}=={version} (wheel only, no dependencies) into {dest}")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--progress-bar", "off", "-d", str(dest), f"{name}=={version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise EngineUnavailable(f"pip download {name}=={version} failed: {proc.stderr.strip()[-500:]}")
        found = sorted(dest.glob(f"{norm}-{version}-*.whl"))
    if not found:
        raise EngineUnavailable(f"no wheel for {name}=={version} in {dest}")
    return found[-1]


def wheel_source(wheel: Path, member: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        try:
            return zf.read(member).decode("utf-8")
        except KeyError as exc:
            raise EngineUnavailable(f"{member} not in {wheel.name}") from exc


def exec_definitions(source: str, origin: str, names: Sequence[str], ns: dict) -> None:
    """Execute only the top-level functions / assignments called `names` of `source` in `ns`.

    Annotations are not evaluated (compiled as under `from __future__ import annotations`).
    """
    tree = ast.parse(source, filename=origin)
    picked, found = [], set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            picked.append(node)
            found.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            tnames = {t.id for t in targets if isinstance(t, ast.Name)}
            hit = tnames & set(names)
            if hit and (not isinstance(node, ast.AnnAssign) or node.value is not None):
                picked.append(node)
                found |= hit
    missing = [n for n in names if n not in found]
    if missing:
        raise EngineUnavailable(f"{origin}: definitions not found: {missing}")
    module = ast.Module(body=picked, type_ignores=[])
    code = compile(module, origin, "exec", flags=_future.annotations.compiler_flag, dont_inherit=True)
    exec(code, ns)


class _FakeOs:
    """Stands in for `os` inside vLLM's init_none_hash: controls PYTHONHASHSEED."""

    def __init__(self):
        self.env: dict[str, str] = {}

    def getenv(self, key, default=None):
        return self.env.get(key, default)

    def urandom(self, n):  # only reached for xxhash without a seed, which we never do
        raise AssertionError("random NONE_HASH seed requested; fixtures always pass a seed")


class _QuietLogger:
    def warning(self, *args, **kwargs):
        pass

    info = debug = warning


class VllmEngine:
    def __init__(self, version: str):
        self.wheel = fetch_wheel("vllm", version)
        self.version = version
        self.os = _FakeOs()
        ns: dict[str, Any] = {
            "__name__": "vllm_engine_extract",
            "hashlib": hashlib, "pickle": pickle, "cbor2": cbor2, "_xxhash": xxhash,
            "Any": Any, "BlockHash": NewType("BlockHash", bytes), "os": self.os,
            "logger": _QuietLogger(),
            "envs": types.SimpleNamespace(VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=True),
        }
        hashing_src = wheel_source(self.wheel, "vllm/utils/hashing.py")
        exec_definitions(hashing_src, f"{self.wheel.name}:vllm/utils/hashing.py",
                         ["sha256", "sha256_cbor", "_xxhash_digest", "xxhash", "xxhash_cbor"], ns)
        utils_src = wheel_source(self.wheel, "vllm/v1/core/kv_cache_utils.py")
        exec_definitions(utils_src, f"{self.wheel.name}:vllm/v1/core/kv_cache_utils.py",
                         ["DEFAULT_NONE_HASH_SEED", "_NON_CRYPTO_HASH_FUNCTIONS",
                          "resolve_none_hash_seed", "init_none_hash", "hash_block_tokens",
                          "maybe_convert_block_hash"], ns)
        self.ns = ns
        assert ns["DEFAULT_NONE_HASH_SEED"] == DEFAULT_NONE_HASH_SEED, ns["DEFAULT_NONE_HASH_SEED"]

    def reference(self, algo: str) -> str:
        fn = VLLM_ALGOS[algo][2]
        return (f"engine:vllm=={self.version} ({self.wheel.name}: vllm/utils/hashing.py {fn}, "
                "vllm/v1/core/kv_cache_utils.py init_none_hash + hash_block_tokens + "
                "maybe_convert_block_hash, run with PYTHONHASHSEED=none_hash_seed when given)")

    def hashes(self, algo, tokens, block_size, none_hash_seed=None, parent_bytes=None,
               lora_name=None, cache_salt=None, extra_keys=None, first_block_extra_keys=None):
        ns = self.ns
        hash_fn = ns[VLLM_ALGOS[algo][2]]
        self.os.env = {} if none_hash_seed is None else {"PYTHONHASHSEED": none_hash_seed}
        if parent_bytes is not None and none_hash_seed is None:
            ns.pop("NONE_HASH", None)  # a chained request never reads NONE_HASH
        else:
            ns["init_none_hash"](hash_fn)
        digests, ints = [], []
        prev = parent_bytes
        for i, block in enumerate(full_blocks(tokens, block_size)):
            extra = vllm_block_extra_keys(i, lora_name, extra_keys, cache_salt,
                                          parent_bytes is not None, first_block_extra_keys)
            prev = ns["hash_block_tokens"](hash_fn, prev, block, extra)
            digests.append(bytes(prev))
            ints.append(ns["maybe_convert_block_hash"](prev))
        return digests, ints


class SglangEngine:
    def __init__(self, version: str):
        self.wheel = fetch_wheel("sglang", version)
        self.version = version
        cpp_member = "sglang/srt/mem_cache/cpp_utils/hash_binding.cpp"
        cpp_src = wheel_source(self.wheel, cpp_member)
        self.native, self.build_note = self._build_native(cpp_src)
        ns: dict[str, Any] = {
            "__name__": "sglang_engine_extract", "array": array, "Any": Any,
            "Optional": Optional, "List": list, "hashlib": hashlib,
            "_load_native_hash_module": lambda: self.native,
        }
        exec_definitions(wheel_source(self.wheel, "sglang/srt/mem_cache/cpp_utils/native_hash.py"),
                         f"{self.wheel.name}:sglang/srt/mem_cache/cpp_utils/native_hash.py",
                         ["_native_hash_input", "get_native_hash"], ns)
        exec_definitions(wheel_source(self.wheel, "sglang/srt/mem_cache/utils.py"),
                         f"{self.wheel.name}:sglang/srt/mem_cache/utils.py",
                         ["get_hash_str", "hash_str_to_int64"], ns)
        self.ns = ns

    @staticmethod
    def _build_native(cpp_src: str):
        try:
            import pybind11
        except ImportError as exc:
            raise EngineUnavailable("pybind11 is needed to build SGLang's native hash") from exc
        cxx = shutil.which(os.environ.get("CXX", "g++"))
        if cxx is None:
            raise EngineUnavailable("no C++ compiler to build SGLang's native hash")
        flags = ["-O3", "-std=c++17", "-DNDEBUG"]
        try:
            if "avx2" in Path("/proc/cpuinfo").read_text(errors="ignore").lower():
                flags.append("-mavx2")  # as SGLang's own loader does
        except OSError:
            pass
        key = hashlib.sha256((cpp_src + " ".join(flags) + sys.version).encode()).hexdigest()[:16]
        out_dir = CACHE_DIR / "build" / f"sglang-native-{key}"
        so_path = out_dir / ("hicache_hash_cpp" + sysconfig.get_config_var("EXT_SUFFIX"))
        if not so_path.exists():
            out_dir.mkdir(parents=True, exist_ok=True)
            src_path = out_dir / "hash_binding.cpp"
            src_path.write_text(cpp_src)
            cmd = [cxx, *flags, "-shared", "-fPIC", "-w",
                   f"-I{sysconfig.get_paths()['include']}", f"-I{pybind11.get_include()}",
                   "-DTORCH_EXTENSION_NAME=hicache_hash_cpp", str(src_path),
                   "-o", str(so_path), "-lcrypto"]
            log("building SGLang's native hash extension from the wheel's hash_binding.cpp")
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise EngineUnavailable(f"building hash_binding.cpp failed: {proc.stderr.strip()[-800:]}")
        spec = importlib.util.spec_from_file_location("hicache_hash_cpp", so_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module, f"hash_binding.cpp built with {Path(cxx).name} {' '.join(flags)}"

    def reference(self) -> str:
        return (f"engine:sglang=={self.version} ({self.wheel.name}: sglang/srt/mem_cache/utils.py "
                "get_hash_str + hash_str_to_int64, cpp_utils/native_hash.py get_native_hash, "
                f"{self.build_note}, linked with OpenSSL)")

    def hashes(self, tokens, block_size, parent_bytes=None):
        full = len(tokens) // block_size * block_size
        if full == 0:
            return [], []
        hexes = self.ns["get_hash_str"](list(tokens[:full]),
                                        parent_bytes.hex() if parent_bytes is not None else None,
                                        block_size)
        assert isinstance(hexes, list) and len(hexes) == full // block_size
        return [bytes.fromhex(h) for h in hexes], [self.ns["hash_str_to_int64"](h) for h in hexes]


# --------------------------------------------------------------------------
# Case construction
# --------------------------------------------------------------------------


def extra_key_json(v: Any) -> dict:
    if isinstance(v, bool):
        raise TypeError("bool extra keys are not part of the fixture format")
    if isinstance(v, str):
        return {"str": v}
    if isinstance(v, int):
        return {"int": str(v)}
    if isinstance(v, bytes):
        return {"bytes_hex": v.hex()}
    if isinstance(v, tuple):
        return {"tuple": [extra_key_json(x) for x in v]}
    raise TypeError(f"unsupported extra key {v!r}")


def assert_no_shared_objects(keys: Sequence[Any], extra: Sequence[Any]) -> None:
    """pickle memoizes str/bytes/tuple by identity; equal values twice in one key set would make
    the bytes depend on object identity, which no other language can reproduce. Forbid it."""
    seen = []

    def walk(v):
        if isinstance(v, (str, bytes, tuple)) and not (isinstance(v, tuple) and len(v) == 0):
            assert v not in seen, f"extra key value {v!r} appears twice"
            seen.append(v)
        if isinstance(v, tuple):
            for x in v:
                walk(x)

    for v in list(keys) + list(extra):
        walk(v)


class Generator:
    def __init__(self, vllm: Optional[VllmEngine], sglang: Optional[SglangEngine]):
        self.vllm = vllm
        self.sglang = sglang
        self.cases: list[dict] = []
        self.names: set[str] = set()
        self.cross_checked: dict[str, int] = {}

    # compute one case -> (u64 list, digest list or None, signed list or None)
    def compute(self, algo, tokens, block_size, o):
        if algo == "xxh3":
            return lib_xxh3(tokens, block_size, o.get("parent")), None, None
        if algo == "xxh3_content":
            assert not o, "xxh3_content takes no options"
            return lib_xxh3_content(tokens, block_size), None, None
        if algo in VLLM_ALGOS:
            kw = {k: o.get(k) for k in ("none_hash_seed", "parent_bytes", "lora_name",
                                        "cache_salt", "extra_keys", "first_block_extra_keys")}
            if algo.startswith("vllm_xxhash"):
                assert kw["none_hash_seed"] is not None or kw["parent_bytes"] is not None
            digests = lib_vllm(algo, tokens, block_size, **kw)
            ints = [vllm_u64(d) for d in digests]
            if self.vllm is not None:
                e_digests, e_ints = self.vllm.hashes(algo, tokens, block_size, **kw)
                assert (e_digests, e_ints) == (digests, ints), f"vLLM engine != libs for {algo}"
                self.cross_checked[algo] = self.cross_checked.get(algo, 0) + 1
            return ints, digests, None
        if algo == "sglang_sha256":
            root = o.get("parent_bytes")
            if root is None:
                root = sglang_salt_root(o.get("cache_salt"))
            digests = lib_sglang(tokens, block_size, root)
            ints = [int.from_bytes(d[:8], "big") for d in digests]
            signed = [sglang_signed(v) for v in ints]
            if self.sglang is not None:
                e_digests, e_signed = self.sglang.hashes(tokens, block_size, root)
                assert (e_digests, e_signed) == (digests, signed), "SGLang engine != libs"
                self.cross_checked[algo] = self.cross_checked.get(algo, 0) + 1
            return ints, digests, signed
        if algo == "trtllm_v1_block_key":
            return lib_trtllm_v1(tokens, block_size, o.get("parent", 0), o.get("lora_id"),
                                 o.get("cache_salt_id")), None, None
        if algo == "trtllm_v2_sha256":
            digests = lib_trtllm_v2(tokens, block_size, o.get("parent_bytes"), o.get("lora_id"),
                                    o.get("cache_salt_id"))
            return [int.from_bytes(d[:8], "big") for d in digests], digests, None
        raise ValueError(algo)

    def add(self, name: str, algo: str, tokens: Sequence[int], block_size: int, **o):
        assert algo in ALGOS
        name = f"{algo}/{name}"
        assert name not in self.names, f"duplicate case name {name}"
        self.names.add(name)
        tokens = list(tokens)
        assert all(0 <= t <= MASK32 for t in tokens)
        if algo.startswith("trtllm") and "cache_salt" in o:
            o["cache_salt_id"] = trt_salt_id(o["cache_salt"])
        if "extra_keys" in o or "lora_name" in o or "cache_salt" in o or "first_block_extra_keys" in o:
            assert_no_shared_objects(list(o.get("extra_keys") or ()) + list(o.get("first_block_extra_keys") or ()),
                                     [x for x in (o.get("lora_name"), o.get("cache_salt")) if x])
        ints, digests, signed = self.compute(algo, tokens, block_size, o)
        assert len(ints) == len(tokens) // block_size
        options: dict[str, Any] = {}
        if "parent_bytes" in o:
            options["parent_hex"] = o["parent_bytes"].hex()
        if "parent" in o:
            options["parent"] = str(o["parent"])
        if "lora_name" in o:
            options["lora_name"] = o["lora_name"]
        if "lora_id" in o:
            options["lora_id"] = str(o["lora_id"])
        if "cache_salt" in o:
            options["cache_salt"] = o["cache_salt"]
        if "cache_salt_id" in o:
            options["cache_salt_id"] = str(o["cache_salt_id"])
        if "none_hash_seed" in o:
            options["none_hash_seed"] = o["none_hash_seed"]
        if "extra_keys" in o:
            options["extra_keys"] = [extra_key_json(k) for k in o["extra_keys"]]
        if "first_block_extra_keys" in o:
            options["first_block_extra_keys"] = [extra_key_json(k) for k in o["first_block_extra_keys"]]
        case: dict[str, Any] = {"name": name, "algo": algo, "block_size": block_size,
                                "options": options, "tokens": tokens,
                                "hashes": [str(v) for v in ints]}
        if digests is not None:
            case["digests"] = [d.hex() for d in digests]
        if signed is not None:
            case["signed"] = [str(v) for v in signed]
        self.cases.append(case)
        return ints, digests

    def continuation(self, name, algo, tokens, block_size, split_blocks, first_opts, second_opts,
                     link):
        """Hash `tokens` whole, then as two halves chained through the first half's last hash.

        link(ints, digests) -> options that carry the parent into the second half.
        """
        whole_i, whole_d = self.add(f"{name}/whole", algo, tokens, block_size, **first_opts)
        cut = split_blocks * block_size
        a_i, a_d = self.add(f"{name}/first_half", algo, tokens[:cut], block_size, **first_opts)
        b_i, b_d = self.add(f"{name}/second_half", algo, tokens[cut:], block_size,
                            **second_opts, **link(a_i, a_d))
        assert a_i + b_i == whole_i, f"{algo} {name}: continuation != whole"
        if whole_d is not None:
            assert a_d + b_d == whole_d


# token material ------------------------------------------------------------

BOUNDARY_TOKENS = [0, 1, 23, 24, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1]


def rand_tokens(rng: random.Random, n: int) -> list[int]:
    """Token ids of mixed widths (byte, short, vocab-sized, 31-bit, full u32)."""
    widths = [8, 16, 17, 17, 17, 31, 32]
    return [rng.getrandbits(widths[rng.getrandbits(16) % len(widths)]) for _ in range(n)]


def seq(a: int, b: int) -> list[int]:
    return list(range(a, b + 1))


def build_cases(gen: Generator) -> None:
    rng = random.Random(0x6B7670)  # "kvp"
    boundary = BOUNDARY_TOKENS + BOUNDARY_TOKENS[::-1]  # 22 tokens
    random_sets = {bs: rand_tokens(rng, bs * k + bs // 2 + 1)
                   for bs, k in ((16, 4), (32, 3), (64, 3), (128, 3))}
    cont_tokens = rand_tokens(rng, 4 * 6 + 3)
    one_block = rand_tokens(rng, 16)
    short = rand_tokens(rng, 5)
    rand_parent_u64 = rng.getrandbits(64)
    rand_parent_32 = rng.getrandbits(256).to_bytes(32, "big")
    rand_parent_16 = rng.getrandbits(128).to_bytes(16, "big")

    def common(algo, base, link):
        gen.add("spec_vector_seq_1_to_33_bs16", algo, seq(1, 33), 16, **base)
        gen.add("spec_vector_seq_1_to_64_bs32", algo, seq(1, 64), 32, **base)
        for bs in (1, 2, 3, 4):
            gen.add(f"boundary_tokens_bs{bs}", algo, boundary, bs, **base)
        for bs, toks in random_sets.items():
            gen.add(f"random_bs{bs}_tail", algo, toks, bs, **base)
        gen.add("empty_tokens", algo, [], 16, **base)
        gen.add("fewer_tokens_than_one_block", algo, short, 16, **base)
        gen.add("exactly_one_block", algo, one_block, 16, **base)
        if link is not None:
            second = {k: v for k, v in base.items() if k != "none_hash_seed"}
            gen.continuation("parent_continuation_bs4", algo, cont_tokens, 4, 3, base, second, link)

    # xxh3 ------------------------------------------------------------------
    common("xxh3", {}, lambda i, d: {"parent": i[-1]})
    gen.add("parent_option_random_u64", "xxh3", random_sets[16], 16, parent=rand_parent_u64)
    gen.add("parent_option_zero", "xxh3", random_sets[16], 16, parent=0)
    gen.add("parent_option_max_u64", "xxh3", boundary, 2, parent=MASK64)

    # xxh3_content ------------------------------------------------------------
    common("xxh3_content", {}, None)
    gen.add("vector_1234_bs4", "xxh3_content", [1, 2, 3, 4], 4)
    gen.add("split_halves_unchained/first_half", "xxh3_content", cont_tokens[:12], 4)
    gen.add("split_halves_unchained/second_half", "xxh3_content", cont_tokens[12:], 4)

    # vLLM family ----------------------------------------------------------
    long_ascii = "".join(chr(0x41 + (i % 26)) for i in range(300))
    for algo in VLLM_ALGOS:
        is_xx = algo.startswith("vllm_xxhash")
        base = {"none_hash_seed": "42"} if is_xx else {}
        plen = 16 if is_xx else 32
        common(algo, base, lambda i, d: {"parent_bytes": d[-1]})
        rp = rand_parent_16 if is_xx else rand_parent_32
        gen.add("parent_option_random_digest", algo, random_sets[16], 16, parent_bytes=rp)
        assert len(rp) == plen
        # NONE_HASH seeds (PYTHONHASHSEED values)
        seeds = ["vllm-none-hash", "0", "4294967295", "random"]
        for s in seeds:
            gen.add(f"none_hash_seed_{s}", algo, random_sets[16], 16, none_hash_seed=s)
        if not is_xx:
            a = gen.cases[-len(seeds)]
            d = next(c for c in gen.cases if c["name"] == f"{algo}/random_bs16_tail")
            assert a["hashes"] == d["hashes"], "default NONE_HASH seed must be vllm-none-hash"
        # LoRA / salt / extra keys
        r16 = random_sets[16]
        gen.add("lora_name", algo, r16, 16, lora_name="sql-lora", **base)
        gen.add("lora_name_non_ascii", algo, r16[:32], 16, lora_name="lora-ñandú-日本", **base)
        gen.add("cache_salt", algo, r16, 16, cache_salt="tenant-A", **base)
        gen.add("cache_salt_empty_string_is_no_salt", algo, r16, 16, cache_salt="", **base)
        gen.continuation("cache_salt_parent_continuation", algo, cont_tokens, 4, 2,
                         dict(base, cache_salt="tenant-A", lora_name="sql-lora"),
                         dict(lora_name="sql-lora"), lambda i, d: {"parent_bytes": d[-1]})
        gen.add("lora_salt_mm_extra_keys", algo, random_sets[32], 32, lora_name="adapter-7",
                cache_salt="salt-xyz", extra_keys=[("mm-hash-4f1c9a", 0)], **base)
        gen.add("extra_key_nested_str_int_tuple", algo, r16, 16,
                extra_keys=[("0b8e2f-image-hash", 12)], **base)
        gen.add("extra_key_bytes", algo, r16, 16,
                extra_keys=[bytes([0, 1, 2, 254, 255])], **base)
        gen.add("extra_key_bytes_300", algo, boundary, 3,
                extra_keys=[bytes(range(256)) + bytes(44)], **base)
        gen.add("extra_key_negative_ints", algo, r16, 16,
                extra_keys=[-1, -24, -25, -256, -257, -65537], **base)
        gen.add("extra_key_wide_ints", algo, r16, 16,
                extra_keys=[-(2**31), -(2**31) - 1, 2**32 + 7, 2**40 + 3, 2**63 - 1, -(2**63)],
                **base)
        gen.add("extra_key_big_int", algo, boundary, 4, extra_keys=[2**32 + 1], **base)
        gen.add("extra_key_non_ascii_str", algo, r16, 16,
                extra_keys=["héllo wörld — 世界 🙂"], **base)
        gen.add("extra_key_str_lengths", algo, r16, 16,
                extra_keys=["x" * 23, "y" * 24, "z" * 255, "w" * 256], **base)
        gen.add("extra_key_str_300_chars", algo, r16, 16, extra_keys=[long_ascii], **base)
        gen.add("extra_key_str_100_cjk_300_bytes", algo, r16, 16, extra_keys=["世" * 100], **base)
        gen.add("extra_key_deep_tuple_and_empty_tuple", algo, r16, 16,
                extra_keys=[("a", (1, b"\x07", ("deep", -5))), ()], **base)
        # tuple arity around the TUPLE1/2/3 vs MARK+TUPLE switch, with and without the salt
        for n in (2, 3):
            gen.add(f"extra_keys_{n}_plus_salt_on_first_block", algo, r16, 16,
                    extra_keys=[f"k{j}" for j in range(n)], cache_salt="s", **base)
        gen.add("extra_keys_5_with_lora", algo, r16, 16, lora_name="L",
                extra_keys=["k0", 1, b"\x02", ("k3", 3), -4], **base)
        # vLLM >= 0.3x tags its own keys; callers can reproduce that through extra_keys
        gen.add("extra_keys_tagged_like_vllm_0_33", algo, r16, 16,
                extra_keys=[("lora", "sql-lora", "/adapters/sql-lora"), ("mm", "4f1c9a", 3)],
                **base)
        gen.add("tagged_keys_like_vllm_0_33_with_first_block_salt", algo, r16, 16,
                extra_keys=[("lora", "sql-lora", "/adapters/sql-lora"), ("mm", "4f1c9a", 3)],
                first_block_extra_keys=[("cache_salt", "tenant-A")], **base)

    # ONE pickle case with a block larger than pickle's 64 KiB frame target
    huge = [rng.getrandbits(32) for _ in range(20000 + 3)]
    blob = pickle.dumps((hashlib.sha256(pickle.dumps(DEFAULT_NONE_HASH_SEED, protocol=5)).digest(),
                         tuple(huge[:20000]), None), protocol=PICKLE_PROTOCOL)
    frames = sum(1 for op, _, _ in pickletools.genops(blob) if op.name == "FRAME")
    assert len(blob) > 64 * 1024 and frames >= 2, (len(blob), frames)
    gen.add("huge_block_20000_tokens_multi_frame_pickle", "vllm_sha256", huge, 20000)

    # SGLang ------------------------------------------------------------------
    common("sglang_sha256", {}, lambda i, d: {"parent_bytes": d[-1]})
    gen.add("parent_option_random_digest", "sglang_sha256", random_sets[16], 16,
            parent_bytes=rand_parent_32)
    # SGLang >= 0.5.2x seeds salted *event* hash chains with this digest as the prior hash
    salt_seed = hashlib.sha256(b"sglang-cache-salt-v1\0" + "tenant-A".encode()).digest()
    gen.add("event_chain_seeded_by_cache_salt_tenant-A", "sglang_sha256", random_sets[16], 16,
            parent_bytes=salt_seed)
    via_parent = gen.cases[-1]["hashes"]
    gen.add("cache_salt_option_tenant-A", "sglang_sha256", random_sets[16], 16, cache_salt="tenant-A")
    assert gen.cases[-1]["hashes"] == via_parent
    gen.add("cache_salt_option_non_ascii", "sglang_sha256", random_sets[32], 32, cache_salt="sål-🙂")

    # TRT-LLM v1 ----------------------------------------------------------
    v1 = "trtllm_v1_block_key"
    common(v1, {}, lambda i, d: {"parent": i[-1]})
    r16 = random_sets[16]
    gen.add("parent_option_random_u64", v1, r16, 16, parent=rand_parent_u64)
    gen.add("parent_option_zero_is_root_salt_applies", v1, r16, 16, parent=0, cache_salt="tenant-A")
    salted, _ = gen.add("cache_salt", v1, r16, 16, cache_salt="tenant-A")
    assert gen.cases[-2]["hashes"] == [str(v) for v in salted]  # parent 0 == root
    gen.add("cache_salt_non_ascii", v1, r16[:32], 16, cache_salt="sål-🙂")
    for lid in (0, 7, 2**63, 2**64 - 1):
        gen.add(f"lora_id_{lid}", v1, r16, 16, lora_id=lid)
    gen.add("lora_id_and_cache_salt", v1, random_sets[32], 32, lora_id=2**63 + 12345,
            cache_salt="tenant-B")
    gen.add("lora_id_and_cache_salt_bs1", v1, boundary, 1, lora_id=3, cache_salt="tenant-B")
    gen.continuation("cache_salt_lora_parent_continuation_salt_ignored_with_parent", v1,
                     cont_tokens, 4, 3, {"cache_salt": "tenant-A", "lora_id": 2**63 + 1},
                     {"cache_salt": "tenant-A", "lora_id": 2**63 + 1}, lambda i, d: {"parent": i[-1]})
    # with a non-zero parent the salt must have had no effect
    first_last = int(gen.cases[-2]["hashes"][-1])
    unsalted = lib_trtllm_v1(cont_tokens[12:], 4, first_last, 2**63 + 1, None)
    assert gen.cases[-1]["hashes"] == [str(v) for v in unsalted]

    # TRT-LLM v2 ----------------------------------------------------------
    v2 = "trtllm_v2_sha256"
    common(v2, {}, lambda i, d: {"parent_bytes": d[-1]})
    gen.add("parent_option_random_digest", v2, r16, 16, parent_bytes=rand_parent_32)
    gen.add("cache_salt", v2, r16, 16, cache_salt="tenant-A")
    gen.add("cache_salt_non_ascii", v2, r16[:32], 16, cache_salt="sål-🙂")
    for lid in (0, 7, 2**63 + 1, 2**64 - 1):
        gen.add(f"lora_id_{lid}", v2, r16, 16, lora_id=lid)
    gen.add("lora_id_and_cache_salt", v2, random_sets[32], 32, lora_id=2**63 + 12345,
            cache_salt="tenant-B")
    gen.add("lora_id_and_cache_salt_bs1", v2, boundary, 1, lora_id=3, cache_salt="tenant-B")
    gen.continuation("lora_salt_parent_continuation", v2, cont_tokens, 4, 3,
                     {"cache_salt": "tenant-A", "lora_id": 9}, {},
                     lambda i, d: {"parent_bytes": d[-1]})


# --------------------------------------------------------------------------
# SPEC vectors
# --------------------------------------------------------------------------


def check_spec_vectors() -> str:
    path = SHARED_DIR / "vectors" / "hashes.json"
    if not path.is_file():
        log(f"WARNING: {path} not found; SPEC vectors not checked")
        return "not found"
    data = json.loads(path.read_text())
    n = 0
    for cname, case in data["cases"].items():
        toks, bs = case["tokens"], case["block_size"]
        for algo, want in case.items():
            if algo in ("tokens", "block_size"):
                continue
            if algo == "xxh3":
                got = [str(v) for v in lib_xxh3(toks, bs)]
            elif algo == "xxh3_content":
                got = [str(v) for v in lib_xxh3_content(toks, bs)]
            elif algo in VLLM_ALGOS:
                got = [str(vllm_u64(d)) for d in lib_vllm(algo, toks, bs)]
            elif algo == "sglang_sha256":
                got = [str(sglang_signed(int.from_bytes(d[:8], "big"))) for d in lib_sglang(toks, bs)]
            elif algo == "trtllm_v1_block_key":
                got = [str(v) for v in lib_trtllm_v1(toks, bs)]
            elif algo == "trtllm_v2_sha256":
                got = [{"hex": d.hex(), "u64": str(int.from_bytes(d[:8], "big"))}
                       for d in lib_trtllm_v2(toks, bs)]
            else:
                raise AssertionError(f"unknown algo {algo} in {path}")
            if isinstance(want, str):
                want = [want]
            assert got == want, f"SPEC vector {cname}/{algo}: got {got}, want {want}"
            n += 1
    log(f"reproduced all {n} SPEC vectors in {path}")
    return f"{n} ok"


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------


def dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def references(vllm: Optional[VllmEngine], sglang: Optional[SglangEngine]) -> dict[str, str]:
    py = f"CPython {platform.python_version()}"
    xx = f"xxhash=={dist_version('xxhash')}"
    cb = f"cbor2=={dist_version('cbor2')}"
    b3 = f"blake3=={dist_version('blake3')}"
    lib_vllm_ref = {
        "vllm_sha256": f"hashlib sha256 + pickle protocol {PICKLE_PROTOCOL} ({py})",
        "vllm_sha256_cbor": f"hashlib sha256 + {cb} canonical",
        "vllm_xxhash": f"{xx} xxh3_128 + pickle protocol {PICKLE_PROTOCOL} ({py})",
        "vllm_xxhash_cbor": f"{xx} xxh3_128 + {cb} canonical",
    }
    refs = {
        "xxh3": f"libs:{xx} (xxh3_64, seed 1337)",
        "xxh3_content": f"libs:{xx} (xxh3_64, seed 1337)",
    }
    for algo, lib in lib_vllm_ref.items():
        if vllm is not None:
            refs[algo] = f"{vllm.reference(algo)}; cross-checked == libs:{lib}"
        else:
            refs[algo] = f"libs:{lib}"
    if sglang is not None:
        refs["sglang_sha256"] = f"{sglang.reference()}; cross-checked == libs:hashlib sha256"
    else:
        refs["sglang_sha256"] = "libs:hashlib sha256"
    salt = (f"cache_salt_id = {b3} 8-byte digest LE" if TRT_SALT_ID_HASH == "blake3"
            else "cache_salt_id = hashlib sha256 first 8 bytes LE")
    refs["trtllm_v1_block_key"] = ("libs:python port of TensorRT-LLM BlockKeyHasher "
                                   f"(tensorrt_llm/runtime/kv_cache_hash.py semantics); {salt}")
    refs["trtllm_v2_sha256"] = ("libs:hashlib sha256, root from TensorRT-LLM ReuseScope bytes "
                                f"(kv_cache_manager_v2 semantics); {salt}")
    return refs


def render(doc: dict) -> str:
    """Pretty but compact JSON: one line per case field, arrays kept on one line."""
    enc = lambda v: json.dumps(v, ensure_ascii=True, separators=(",", ":"))  # noqa: E731
    lines = ["{", f'  "generator": {enc(doc["generator"])},', '  "references": {']
    refs = list(doc["references"].items())
    for i, (k, v) in enumerate(refs):
        lines.append(f"    {enc(k)}: {enc(v)}" + ("," if i + 1 < len(refs) else ""))
    lines.append("  },")
    if "trtllm_salt_ids" in doc:
        lines.append(f'  "trtllm_salt_ids": {enc(doc["trtllm_salt_ids"])},')
    lines.append('  "cases": [')
    for ci, case in enumerate(doc["cases"]):
        lines.append("    {")
        items = list(case.items())
        for i, (k, v) in enumerate(items):
            lines.append(f"      {enc(k)}: {enc(v)}" + ("," if i + 1 < len(items) else ""))
        lines.append("    }" + ("," if ci + 1 < len(doc["cases"]) else ""))
    lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true",
                    help="regenerate in memory; exit 1 if fixtures/hashes.json differs")
    ap.add_argument("--engine", action="store_true",
                    default=os.environ.get("KVPLANE_FIXTURES_ENGINE", "") not in ("", "0"),
                    help="also run the engines' own code from their wheels and cross-check "
                         "(env KVPLANE_FIXTURES_ENGINE=1)")
    ap.add_argument("--require-engine", action="store_true",
                    help="with --engine: fail instead of falling back when an engine is unavailable")
    ap.add_argument("--vllm-version", default=VLLM_VERSION)
    ap.add_argument("--sglang-version", default=SGLANG_VERSION)
    ap.add_argument("--output", type=Path, default=OUT_PATH)
    args = ap.parse_args()

    assert PICKLE_PROTOCOL == 5, f"pickle.HIGHEST_PROTOCOL is {PICKLE_PROTOCOL}; fixtures assume 5"
    check_spec_vectors()

    vllm = sglang = None
    if args.engine or args.require_engine:
        for label, make in (("vllm", lambda: VllmEngine(args.vllm_version)),
                            ("sglang", lambda: SglangEngine(args.sglang_version))):
            try:
                obj = make()
            except EngineUnavailable as exc:
                if args.require_engine:
                    raise
                log(f"{label} engine code unavailable, using library reimplementation: {exc}")
                continue
            if label == "vllm":
                vllm = obj
            else:
                sglang = obj

    gen = Generator(vllm, sglang)
    build_cases(gen)
    for algo, n in sorted(gen.cross_checked.items()):
        log(f"engine == libs for all {n} {algo} cases")

    salts = ["tenant-A", "", "sål-🙂", "x" * 300]
    salt_ids = [{"salt": s, "sha256": str(trt_salt_id(s, "sha256")), "blake3": str(trt_salt_id(s, "blake3"))}
                for s in salts]
    doc = {"generator": GENERATOR, "references": references(vllm, sglang),
           "trtllm_salt_ids": salt_ids, "cases": gen.cases}
    text = render(doc)
    counts: dict[str, int] = {}
    for c in gen.cases:
        counts[c["algo"]] = counts.get(c["algo"], 0) + 1
    log("cases per algo: " + ", ".join(f"{a}={counts.get(a, 0)}" for a in ALGOS)
        + f" (total {len(gen.cases)}, {len(text.encode())} bytes)")

    if args.check:
        if not args.output.is_file():
            log(f"{args.output} is missing")
            return 1
        committed_text = args.output.read_text()
        committed = json.loads(committed_text)
        if text == committed_text:
            log(f"{args.output} is up to date")
            return 0
        same_cases = render(dict(doc, references=committed.get("references"))) == committed_text
        if same_cases:
            differ = [k for k, v in committed.get("references", {}).items()
                      if doc["references"].get(k) != v]
            log(f"{args.output}: cases up to date (references of {', '.join(differ)} differ: "
                "committed file was made with --engine or other library versions; allowed)")
            return 0
        log(f"{args.output} is STALE: run python3 {GENERATOR}"
            + (" --engine" if any(str(v).startswith("engine:")
                                  for v in committed.get("references", {}).values()) else ""))
        return 1

    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    log(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
