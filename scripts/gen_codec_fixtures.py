#!/usr/bin/env python3
"""Generate golden wire fixtures (fixtures/codec.json) for kvplane's codecs.

Payloads are produced by the reference encoders themselves:

* msgspec (the encoder vLLM and SGLang use) with struct definitions for every
  generation of the ZMQ event stream in SPEC section 3.1 (legacy tagged arrays
  of 6 to 12 slots, SGLang's salted slot, 2/3/4-slot batches, the mid-2026 map
  structs and the current ones). With --engine the current structs are also
  loaded from vLLM's and SGLang's published wheels (vllm/distributed/kv_events.py,
  sglang/srt/disaggregation/kv_events.py) and every current-generation payload
  is re-encoded with them: the bytes must be identical.
* The official protobuf runtime with SMG's own messages (smg-grpc-proto) for
  KvEventBatch.
* json.dumps for TensorRT-LLM's event list, shaped as its KVCacheEventSerializer
  writes it.

Each case records the payload (hex), the dialect, and what it must decode to in
kvplane's normalized model (u64 values as decimal strings), or the error code.
Cases marked "reencode" must come back byte for byte from kvplane's encoder.

Usage:
    python3 scripts/gen_codec_fixtures.py            # write fixtures/codec.json
    python3 scripts/gen_codec_fixtures.py --engine   # same, cross-checked with the wheels
    python3 scripts/gen_codec_fixtures.py --check    # exit 1 if the file is stale
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import random
import sys
import zipfile
from pathlib import Path
from typing import Any, Optional, Union

import msgspec
from smg_grpc_proto.generated import common_pb2 as pb

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "fixtures" / "codec.json"
sys.path.insert(0, str(Path(__file__).resolve().parent))

U64 = (1 << 64) - 1


# --------------------------------------------------------------------------------------------
# Struct definitions of every stream generation (field names and orders are the engines').
# --------------------------------------------------------------------------------------------

def legacy_generation(stored_fields: list[tuple[str, Any]], removed_fields: list[tuple[str, Any]]):
    """Tagged-array structs (array_like=True, tag=True): every declared field is written."""
    ns: dict[str, Any] = {}

    class Base(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
        pass

    ns["BlockStored"] = msgspec.defstruct("BlockStored", stored_fields, bases=(Base,))
    ns["BlockRemoved"] = msgspec.defstruct("BlockRemoved", removed_fields, bases=(Base,))
    ns["AllBlocksCleared"] = msgspec.defstruct("AllBlocksCleared", [], bases=(Base,))
    return ns


HashT = Union[int, bytes]
V6 = [("block_hashes", list[HashT]), ("parent_block_hash", Optional[HashT]),
      ("token_ids", list[Any]), ("block_size", int), ("lora_id", Optional[int])]
V7 = V6 + [("medium", Optional[str])]
V8 = V7 + [("lora_name", Optional[str])]
V10 = V8 + [("extra_keys", Optional[list[Any]]), ("group_idx", Optional[int])]
V12 = V10 + [("kv_cache_spec_kind", Optional[str]), ("kv_cache_spec_sliding_window", Optional[int])]
R2 = [("block_hashes", list[HashT])]
R3 = R2 + [("medium", Optional[str])]
R4 = R3 + [("group_idx", Optional[int])]

LEGACY = {
    "array6": legacy_generation(V6, R2),
    "array7": legacy_generation(V7, R3),
    "array8": legacy_generation(V8, R3),
    "array10": legacy_generation(V10, R4),
    "array12": legacy_generation(V12, R4),
}


class SaltSlot(msgspec.Struct):
    cache_salt: Optional[str] = None


# SGLang's salted legacy variant: a {cache_salt} map in slot 8.
LEGACY["sglang_salted"] = legacy_generation(V7 + [("salt", SaltSlot)], R3)


def map_generation(stored_fields, removed_fields):
    """Tagged-map structs (omit_defaults=True, tag=True): fields with a default are omitted
    when None; the others are always written."""

    class Base(msgspec.Struct, omit_defaults=True, tag=True):
        pass

    return {
        "BlockStored": msgspec.defstruct("BlockStored", stored_fields, bases=(Base,)),
        "BlockRemoved": msgspec.defstruct("BlockRemoved", removed_fields, bases=(Base,)),
        "AllBlocksCleared": msgspec.defstruct("AllBlocksCleared", [], bases=(Base,)),
    }


def opt(name, t=Optional[str]):
    return (name, t, None)


VLLM_STORED_REQUIRED = [("block_hashes", list[HashT]), ("parent_block_hash", Optional[HashT]),
                        ("token_ids", list[int]), ("block_size", int), ("lora_id", Optional[int]),
                        ("medium", Optional[str]), ("lora_name", Optional[str])]
MAPS = {
    # vLLM mid-2026: 13 declared fields (+ tag = 14: a fixmap header).
    "vllm_map_2026": map_generation(
        VLLM_STORED_REQUIRED + [opt("extra_keys", Optional[list[Any]]), opt("group_idx", Optional[int]),
                                opt("kv_cache_spec_kind"), opt("kv_cache_spec_sliding_window", Optional[int]),
                                opt("locality"), opt("session_id")],
        [("block_hashes", list[HashT]), ("medium", Optional[str]), opt("group_idx", Optional[int]),
         opt("locality")]),
    # vLLM now (0.33): 15 declared fields (+ tag = 16: a map16 header).
    "vllm_map": map_generation(
        VLLM_STORED_REQUIRED + [opt("extra_keys", Optional[list[Any]]), opt("group_idx", Optional[int]),
                                opt("kv_cache_spec_kind"), opt("kv_cache_spec_sliding_window", Optional[int]),
                                opt("locality"), opt("ownership"), opt("session_id"),
                                opt("lookahead_token_ids", Optional[list[list[int]]])],
        [("block_hashes", list[HashT]), ("medium", Optional[str]), opt("group_idx", Optional[int]),
         opt("locality"), opt("ownership")]),
    # SGLang now (0.5.23): signed hashes, medium optional.
    "sglang_map": map_generation(
        [("block_hashes", list[int]), ("parent_block_hash", Optional[int]), ("token_ids", list[Any]),
         ("block_size", int), ("lora_id", Optional[int]), opt("medium"), opt("cache_salt"),
         opt("session_id"), opt("lora_name")],
        [("block_hashes", list[int]), opt("medium")]),
}


class Batch2(msgspec.Struct, array_like=True):
    ts: float
    events: list[Any]


class Batch3(msgspec.Struct, array_like=True):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class Batch4(msgspec.Struct, array_like=True):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None
    publisher_id: Optional[str] = None


ENC = msgspec.msgpack.Encoder()


# --------------------------------------------------------------------------------------------
# Normalized expectations
# --------------------------------------------------------------------------------------------

def u64(v: int | bytes) -> str:
    if isinstance(v, bytes):
        return str(int.from_bytes(v[-8:], "big"))
    return str(v & U64)


def norm_value(v: Any) -> Any:
    """The JSON form of an opaque value (bytes as {"$bin": hex})."""
    if isinstance(v, bytes):
        return {"$bin": v.hex()}
    if isinstance(v, (list, tuple)):
        return [norm_value(x) for x in v]
    if isinstance(v, dict):
        return {k: norm_value(x) for k, x in v.items()}
    return v


def flat_tokens(tokens: list[Any]) -> list[int]:
    # EAGLE pairs: the pair's first token is the position's token.
    return [t[0] if isinstance(t, (list, tuple)) else t for t in tokens]


def norm_stored(f: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "stored"}
    hashes = f["block_hashes"]
    out["block_hashes"] = [u64(h) for h in hashes]
    if f.get("parent_block_hash") is not None:
        out["parent_block_hash"] = u64(f["parent_block_hash"])
    out["token_ids"] = flat_tokens(f.get("token_ids", []))
    out["block_size"] = f["block_size"]
    if f.get("lora_id") is not None:
        out["lora_id"] = str(f["lora_id"])
    for k in ("medium", "lora_name", "cache_salt", "kv_cache_spec_kind", "locality",
              "ownership", "session_id"):
        if f.get(k) is not None:
            out[k] = f[k]
    for k in ("group_idx",):
        if f.get(k) is not None:
            out[k] = f[k]
    if f.get("kv_cache_spec_sliding_window") is not None:
        out["kv_cache_spec_sliding_window"] = str(f["kv_cache_spec_sliding_window"])
    for k in ("extra_keys", "lookahead_token_ids"):
        if f.get(k) is not None:
            out[k] = norm_value(f[k])
    hb: dict[str, Any] = {}
    if hashes and isinstance(hashes[0], bytes):
        hb["blocks"] = [h.hex() for h in hashes]
    if isinstance(f.get("parent_block_hash"), bytes):
        hb["parent"] = f["parent_block_hash"].hex()
    if hb:
        out["hash_bytes"] = hb
    return out


def norm_removed(f: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "removed", "block_hashes": [u64(h) for h in f["block_hashes"]]}
    for k in ("medium", "group_idx", "locality", "ownership"):
        if f.get(k) is not None:
            out[k] = f[k]
    if f["block_hashes"] and isinstance(f["block_hashes"][0], bytes):
        out["hash_bytes"] = [h.hex() for h in f["block_hashes"]]
    return out


def make_event(gen: dict[str, Any], kind: str, fields: dict[str, Any]):
    cls = gen[{"stored": "BlockStored", "removed": "BlockRemoved", "cleared": "AllBlocksCleared"}[kind]]
    names = set(cls.__struct_fields__)
    args = {k: v for k, v in fields.items() if k in names}
    if "salt" in names:
        args["salt"] = SaltSlot(cache_salt=fields.get("cache_salt"))
    for name in cls.__struct_fields__:
        args.setdefault(name, None)
    if kind == "cleared":
        return cls(), {"type": "cleared"}
    kept = dict(args)
    if "salt" in names:
        kept["cache_salt"] = fields.get("cache_salt")
    return cls(**args), (norm_stored(kept) if kind == "stored" else norm_removed(kept))


# --------------------------------------------------------------------------------------------
# Case builders
# --------------------------------------------------------------------------------------------

CASES: list[dict[str, Any]] = []


def add(name: str, dialect: str, payload: bytes, expect: Any = None, error: str | None = None,
        reencode: str | None = None, unknown_events: int = 0, event_ids: Any = None) -> None:
    case: dict[str, Any] = {"name": name, "dialect": dialect, "payload": payload.hex()}
    if error:
        case["error"] = error
    else:
        case["expect"] = {"batches": expect, "unknown_events": unknown_events}
        if event_ids is not None:
            case["expect"]["event_ids"] = event_ids
    if reencode:
        case["reencode"] = reencode
    CASES.append(case)


def rng_tokens(r: random.Random, n: int) -> list[int]:
    return [r.randrange(0, 200_000) for _ in range(n)]


def sample_events(r: random.Random, kinds: str, bs: int, rich: bool, signed: bool = False,
                  byte_hashes: int = 0) -> list[tuple[str, dict[str, Any]]]:
    """Events (kind, fields) covering the value ranges msgspec's int rules distinguish."""
    def h() -> int | bytes:
        if byte_hashes:
            return r.randbytes(byte_hashes)
        v = r.choice([r.randrange(0, 128), r.randrange(1 << 8, 1 << 16), r.randrange(1 << 32, 1 << 63),
                      r.randrange(1 << 63, 1 << 64)])
        return v - (1 << 64) if signed and v >= (1 << 63) else v

    out = []
    for k in kinds:
        if k == "s":
            n = r.randrange(1, 4)
            f: dict[str, Any] = {"block_hashes": [h() for _ in range(n)],
                                 "parent_block_hash": r.choice([None, h()]),
                                 "token_ids": rng_tokens(r, n * bs), "block_size": bs,
                                 "lora_id": r.choice([None, 0, 7, -3, 1 << 40]),
                                 "medium": r.choice([None, "GPU", "CPU", "CPU_TIER2", "S3_BUCKET"])}
            if rich:
                f.update({"lora_name": r.choice([None, "adapter-a"]),
                          "extra_keys": r.choice([None, [["adapter-a", ["img-1", 16], "salt"]] + [None] * (n - 1)]),
                          "group_idx": r.choice([None, 0, 2]),
                          "kv_cache_spec_kind": r.choice([None, "full_attention", "sliding_window"]),
                          "kv_cache_spec_sliding_window": r.choice([None, 4096]),
                          "locality": r.choice([None, "LOCAL", "REMOTE"]),
                          "ownership": r.choice([None, "engine"]),
                          "session_id": r.choice([None, "sess-" + "x" * r.choice([3, 40, 300])]),
                          "cache_salt": r.choice([None, "tenant-7"]),
                          "lookahead_token_ids": r.choice([None, [rng_tokens(r, 2) for _ in range(n)]])})
            out.append(("stored", f))
        elif k == "r":
            out.append(("removed", {"block_hashes": [h() for _ in range(r.randrange(1, 20))],
                                    "medium": r.choice([None, "GPU", "DISK"]),
                                    "group_idx": r.choice([None, 1]) if rich else None,
                                    "locality": r.choice([None, "LOCAL"]) if rich else None,
                                    "ownership": r.choice([None, "agent"]) if rich else None}))
        else:
            out.append(("cleared", {}))
    return out


def zmq_cases(r: random.Random) -> None:
    # Legacy tagged arrays of every length, in 2- and 3-slot batches.
    for gen_name, gen in LEGACY.items():
        for batch_cls in (Batch2, Batch3):
            for trial in range(3):
                evs = sample_events(r, "ssrsc", 16, rich=True)
                objs, norm = zip(*(make_event(gen, k, f) for k, f in evs))
                dp = None if batch_cls is Batch2 else r.choice([None, 0, 3])
                b = batch_cls(ts=1732000000.25 + trial, events=list(objs)) if batch_cls is Batch2 else \
                    batch_cls(ts=1732000000.25 + trial, events=list(objs), data_parallel_rank=dp)
                reenc = "vllm_legacy" if gen_name == "array12" and batch_cls is Batch3 else None
                add(f"{gen_name}/{batch_cls.__name__.lower()}/{trial}",
                    "sglang" if gen_name == "sglang_salted" else "vllm", ENC.encode(b),
                    [{"ts": b.ts, "dp_rank": dp, "events": list(norm)}], reencode=reenc)
    # Tagged maps of each generation.
    for gen_name, gen in MAPS.items():
        signed = gen_name.startswith("sglang")
        for trial in range(6):
            evs = sample_events(r, "sssrrcs", r.choice([1, 16, 64]), rich=True, signed=signed)
            objs, norm = zip(*(make_event(gen, k, f) for k, f in evs))
            dp = r.choice([None, 0, 1, 7])
            b = Batch3(ts=1732000000.0 + trial / 8, events=list(objs), data_parallel_rank=dp)
            reenc = {"vllm_map": "vllm", "sglang_map": "sglang"}.get(gen_name)
            add(f"{gen_name}/{trial}", "sglang" if signed else "vllm", ENC.encode(b),
                [{"ts": b.ts, "dp_rank": dp, "events": list(norm)}], reencode=reenc)
    # Byte-string hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0): sha256 and xxhash digests.
    for width in (32, 16):
        gen = MAPS["vllm_map"]
        evs = sample_events(r, "srs", 16, rich=False, byte_hashes=width)
        objs, norm = zip(*(make_event(gen, k, f) for k, f in evs))
        b = Batch3(ts=5.5, events=list(objs), data_parallel_rank=0)
        add(f"vllm_map/bin{width}", "vllm", ENC.encode(b),
            [{"ts": 5.5, "dp_rank": 0, "events": list(norm)}], reencode="vllm")
    # A big batch (array16/32 headers, many events).
    gen = MAPS["vllm_map"]
    evs = sample_events(r, "s" * 1100 + "r" * 200, 16, rich=False)
    objs, norm = zip(*(make_event(gen, k, f) for k, f in evs))
    b = Batch3(ts=9.0, events=list(objs), data_parallel_rank=2)
    add("vllm_map/1300-events", "vllm", ENC.encode(b), [{"ts": 9.0, "dp_rank": 2, "events": list(norm)}],
        reencode="vllm")
    # A 4-slot batch (a future publisher id) and keys/tags/media this version does not know.
    stored, stored_norm = make_event(gen, "stored", sample_events(r, "s", 4, rich=False)[0][1])
    payload = ENC.encode(Batch4(ts=2.0, events=[stored], data_parallel_rank=1, publisher_id="pub-a"))
    add("batch4/publisher-id", "vllm", payload, [{"ts": 2.0, "dp_rank": 1, "events": [stored_norm]}])
    raw = msgspec.msgpack.decode(ENC.encode(stored))
    shuffled = dict(reversed(list(raw.items())))
    shuffled["future_field"] = {"nested": [1, 2, {"x": b"\x00"}]}
    shuffled["medium"] = "CXL_POOL"
    unknown = {"type": "BlockPinned", "block_hashes": [1, 2]}
    payload = ENC.encode([3.0, [shuffled, unknown, ["BlockEvicted", [1]]], None])
    expect = dict(stored_norm)
    expect["medium"] = "CXL_POOL"
    add("map/key-order-unknown-keys-tags-media", "vllm", payload,
        [{"ts": 3.0, "dp_rank": None, "events": [expect]}], unknown_events=2)
    # SGLang EAGLE bigram pairs: one page per event, block_size = number of pairs.
    toks = rng_tokens(r, 17)
    pairs = [[toks[j], toks[j + 1]] for j in range(16)]
    ev, norm = make_event(MAPS["sglang_map"], "stored", {
        "block_hashes": [-5], "parent_block_hash": -(1 << 63), "token_ids": pairs, "block_size": 16,
        "lora_id": None})
    add("sglang_map/eagle-pairs", "sglang", ENC.encode(Batch3(ts=4.0, events=[ev], data_parallel_rank=0)),
        [{"ts": 4.0, "dp_rank": 0, "events": [norm]}])
    # TensorRT-LLM over ZMQ (vLLM field names, signed hashes, one event per batch, extra keys).
    trt = {"type": "BlockStored", "block_hashes": [-77, 12], "parent_block_hash": None,
           "token_ids": list(range(8)), "block_size": 4, "lora_id": None,
           "block_mm_infos": [None, {"mm_objects": [{"mm_hash": 5, "offsets": []}]}]}
    add("trtllm_zmq/stored", "trtllm", ENC.encode([7.0, [trt], 0]),
        [{"ts": 7.0, "dp_rank": 0, "events": [{"type": "stored", "block_hashes": [u64(-77), "12"],
                                                "token_ids": list(range(8)), "block_size": 4}]}])


def layout_cases(r: random.Random) -> None:
    gen = MAPS["vllm_map"]
    shapes = {
        "partial-block": ([1, 2], list(range(24)), 16),
        "sliding-window-null-blocks": ([1], list(range(48)), 16),
        "hash-only-placeholder": ([1, 2, 3], [], 0),
        "hash-only-with-block-size": ([1, 2, 3], [], 16),
    }
    for name, (hashes, toks, bs) in shapes.items():
        ev, _ = make_event(gen, "stored", {"block_hashes": hashes, "parent_block_hash": None,
                                           "token_ids": toks, "block_size": bs, "lora_id": None})
        add(f"layout/{name}", "vllm", ENC.encode(Batch3(ts=1.0, events=[ev], data_parallel_rank=0)),
            error="ERR_UNSUPPORTED_LAYOUT")


def malformed_cases() -> None:
    good = ENC.encode(Batch3(ts=1.0, events=[MAPS["vllm_map"]["AllBlocksCleared"]()], data_parallel_rank=0))
    for name, payload in {
        "empty": b"",
        "not-an-array": ENC.encode({"ts": 1.0}),
        "one-slot": ENC.encode([1.0]),
        "truncated": good[:-1],
        "trailing-bytes": good + b"\x00",
        "event-not-a-container": ENC.encode([1.0, [5], None]),
        "map-without-type": ENC.encode([1.0, [{"block_hashes": [1]}], None]),
        "token-out-of-range": ENC.encode([1.0, [{"type": "BlockStored", "block_hashes": [1],
                                                 "parent_block_hash": None, "token_ids": [1 << 33],
                                                 "block_size": 1, "lora_id": None}], None]),
        "mixed-hash-types": ENC.encode([1.0, [{"type": "BlockRemoved", "block_hashes": [1, b"\x01" * 32],
                                               "medium": None}], None]),
        "reserved-marker": bytes([0x93, 0xc1, 0x90, 0xc0]),
        "huge-array-length": bytes([0x93, 0xcb]) + b"\x00" * 8 + bytes([0xdd, 0xff, 0xff, 0xff, 0xff]),
    }.items():
        add(f"malformed/{name}", "vllm", payload, error="ERR_DECODE")


# --------------------------------------------------------------------------------------------
# SMG protobuf (official runtime)
# --------------------------------------------------------------------------------------------

LEVEL = {"GPU": 0, "CPU": 1, "CPU_TIER2": 2, "DISK": 2, "EXTERNAL": 3}
MEDIUM_OF_LEVEL = {0: "GPU", 1: "CPU", 2: "DISK", 3: "EXTERNAL"}
LOCALITY = {"LOCAL": 1, "REMOTE": 2}


def proto_cases(r: random.Random) -> None:
    """Batches built with SMG's messages. kvplane writes one KvBlock per hash with its tokens,
    `cache_level` and `tier` from the medium, and event_id = (seq << 32) | index."""
    for trial in range(8):
        seq = r.choice([1, 2, 1 << 40])
        msg = pb.KvEventBatch(sequence_number=seq, timestamp=1732000000.5 + trial)
        dp = r.choice([None, 0, 3])
        if dp is not None:
            msg.dp_rank = dp
        norm_events = []
        for i, (kind, f) in enumerate(sample_events(r, "ssrcs", r.choice([4, 16]), rich=True)):
            ev = msg.events.add(event_id=((seq & 0xFFFFFFFF) << 32) | i)
            medium = f.get("medium")
            level = LEVEL.get(medium) if medium else None
            if kind == "stored":
                bs = f["block_size"]
                st = ev.stored
                extra = f.get("extra_keys")
                for j, hv in enumerate(f["block_hashes"]):
                    blk = st.blocks.add(block_hash=hv - (1 << 64) if hv >= 1 << 63 else hv,
                                        token_ids=f["token_ids"][j * bs:(j + 1) * bs], block_size=bs)
                    if f.get("lora_id") is not None:
                        blk.lora_id = f["lora_id"]
                    if level is not None:
                        blk.cache_level = level
                    for key in (extra[j] if extra and extra[j] else []):
                        k = blk.extra_keys.add()
                        if isinstance(key, str):
                            k.text = key
                        elif isinstance(key, list):
                            k.multimodal.identifier, k.multimodal.offset = key
                if f.get("parent_block_hash") is not None:
                    p = f["parent_block_hash"]
                    st.parent_block_hash = p - (1 << 64) if p >= 1 << 63 else p
                if level is not None:
                    st.tier = level + 1
                for k in ("medium", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window",
                          "ownership", "session_id", "lora_name", "cache_salt"):
                    if f.get(k) is not None:
                        setattr(st, k, f[k])
                if f.get("locality") is not None:
                    st.locality = LOCALITY[f["locality"]]
                n = norm_stored(f)
                n.pop("lookahead_token_ids", None)
                norm_events.append(n)
            elif kind == "removed":
                rm = ev.removed
                rm.block_hashes.extend(h - (1 << 64) if h >= 1 << 63 else h for h in f["block_hashes"])
                if level is not None:
                    rm.cache_level = level
                    rm.tier = level + 1
                for k in ("medium", "group_idx", "ownership"):
                    if f.get(k) is not None:
                        setattr(rm, k, f[k])
                if f.get("locality") is not None:
                    rm.locality = LOCALITY[f["locality"]]
                norm_events.append(norm_removed(f))
            else:
                ev.cleared.SetInParent()
                norm_events.append({"type": "cleared"})
        ids = [e.event_id for e in msg.events]
        add(f"smg_proto/{trial}", "smg_proto", msg.SerializeToString(),
            [{"seq": str(seq), "ts": msg.timestamp, "dp_rank": dp, "events": norm_events}],
            reencode="smg_proto", event_ids=[[str(i) for i in ids]])
    # Tier/level only (no medium string) decodes to the tier's medium; unknown fields skipped.
    msg = pb.KvEventBatch(sequence_number=3)
    ev = msg.events.add(event_id=9)
    ev.stored.blocks.add(block_hash=-1, token_ids=[1, 2], block_size=2, cache_level=1)
    ev.stored.tier = 2
    msg.snapshot.index = 1
    msg.snapshot.count = 2
    add("smg_proto/tier-only-and-snapshot-field", "smg_proto", msg.SerializeToString(),
        [{"seq": "3", "ts": 0.0, "dp_rank": None, "events": [
            {"type": "stored", "block_hashes": [str(U64)], "token_ids": [1, 2], "block_size": 2,
             "medium": "CPU"}]}], event_ids=[["9"]])
    for name, payload in {"truncated-varint": b"\x08\xff", "length-past-end": b"\x1a\x10\x08\x01",
                          "bad-wire-type": b"\x0f"}.items():
        add(f"smg_proto/malformed/{name}", "smg_proto", payload, error="ERR_DECODE")


# --------------------------------------------------------------------------------------------
# TensorRT-LLM JSON (KVCacheEventSerializer's shape)
# --------------------------------------------------------------------------------------------

def trt_block(h, tokens, level=0, salt=None):
    return {"type": "stored_block", "block_hash": h,
            "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in tokens],
            "cache_salt": salt, "cache_level": level, "priority": 35, "mm_keys": []}


def trtllm_cases() -> None:
    v2_root = "9f2c" + "ab" * 30
    v2_child = "01" * 32
    events = [
        {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [2048, 8192]},
         "window_size": 4096},
        {"event_id": 1, "data": {"type": "stored", "parent_hash": None, "blocks": [
            trt_block(924206229973855, [1, 2, 3, 4]), trt_block(18177682803760873588, [5, 6, 7, 8])]},
         "window_size": 4096, "hash_algo": "v1_block_key", "attention_dp_rank": 0, "layer_group_id": 0},
        {"event_id": 2, "data": {"type": "stored", "parent_hash": 18177682803760873588, "blocks": [
            trt_block(6875034662206558884, [9, 10, 11, 12], level=1, salt="tenant")]},
         "window_size": 4096, "hash_algo": "v1_block_key", "attention_dp_rank": 0, "layer_group_id": 0},
        {"event_id": 3, "data": {"type": "updated", "block_hash": 6875034662206558884,
                                 "cache_level": {"type": "event_diff", "new_value": 1, "old_value": 0},
                                 "priority": None}, "window_size": 4096, "attention_dp_rank": 0},
        {"event_id": 4, "data": {"type": "removed", "block_hashes": [6875034662206558884]},
         "window_size": 4096, "attention_dp_rank": 0},
        {"event_id": 5, "data": {"type": "stored", "parent_hash": None, "blocks": [
            trt_block(v2_root, [1, 2]), trt_block(v2_child, [3, 4])]},
         "window_size": 128, "hash_algo": "v2_sha256", "attention_dp_rank": 1, "layer_group_id": 1},
        {"event_id": 6, "data": {"type": "removed", "block_hashes": [v2_child]},
         "window_size": 128, "hash_algo": "v2_sha256", "attention_dp_rank": 1},
        {"event_id": 8, "data": {"type": "future_kind"}, "window_size": 128, "attention_dp_rank": 1},
    ]

    def first8(hexs):
        return str(int.from_bytes(bytes.fromhex(hexs)[:8], "big"))

    expect = [
        {"ts": 0.0, "dp_rank": None, "events": [
            {"type": "created", "num_blocks_per_cache_level": [2048, 8192]}]},
        {"ts": 0.0, "dp_rank": 0, "events": [
            {"type": "stored", "block_hashes": ["924206229973855", "18177682803760873588"],
             "token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "block_size": 4, "medium": "GPU", "group_idx": 0},
            {"type": "stored", "block_hashes": ["6875034662206558884"],
             "parent_block_hash": "18177682803760873588", "token_ids": [9, 10, 11, 12], "block_size": 4,
             "medium": "CPU", "cache_salt": "tenant", "group_idx": 0},
            {"type": "updated", "block_hash": "6875034662206558884", "cache_level": {"old": 0, "new": 1}},
            {"type": "removed", "block_hashes": ["6875034662206558884"]}]},
        {"ts": 0.0, "dp_rank": 1, "events": [
            {"type": "stored", "block_hashes": [first8(v2_root), first8(v2_child)], "token_ids": [1, 2, 3, 4],
             "block_size": 2, "medium": "GPU", "group_idx": 1,
             "hash_bytes": {"blocks": [v2_root, v2_child]}},
            {"type": "removed", "block_hashes": [first8(v2_child)], "hash_bytes": [v2_child]}]},
    ]
    add("trtllm_json/every-event-type", "trtllm_json", json.dumps(events).encode(), expect,
        unknown_events=1, event_ids=[["0"], ["1", "2", "3", "4"], ["5", "6"]])
    partial = [{"event_id": 0, "data": {"type": "stored", "parent_hash": None, "blocks": [
        trt_block(1, [1, 2, 3, 4]), trt_block(2, [5, 6])]}, "window_size": 64}]
    add("trtllm_json/partial-block", "trtllm_json", json.dumps(partial).encode(), error="ERR_UNSUPPORTED_LAYOUT")
    for name, payload in {"not-json": b"{", "not-a-list": b"42", "no-event-id": b'[{"data": {}}]',
                          "bad-hex": b'[{"event_id": 0, "data": {"type": "removed", "block_hashes": ["zz"]}}]'}.items():
        add(f"trtllm_json/malformed/{name}", "trtllm_json", payload, error="ERR_DECODE")


# --------------------------------------------------------------------------------------------
# Engine cross-check (--engine): the wheels' own structs give the same bytes
# --------------------------------------------------------------------------------------------

def engine_structs(name: str, version: str, member: str) -> dict[str, Any]:
    from gen_hash_fixtures import fetch_wheel  # same wheel cache
    src = zipfile.ZipFile(fetch_wheel(name, version)).read(member).decode()
    # Only the event structs (and the helpers defined between them) are executed: everything from
    # the first class up to the publisher, with the engine's imports replaced by what they need.
    start = src.index("class EventBatch(")
    end = src.index("class EventPublisher(")
    import types
    mod = types.ModuleType(f"_kvplane_ref_{name}")
    sys.modules[mod.__name__] = mod  # msgspec resolves the structs' annotations through it
    ns = mod.__dict__
    ns.update({"msgspec": msgspec, "Any": Any, "Optional": Optional, "Union": Union,
               "ExternalBlockHash": Union[bytes, int], "enum": __import__("enum"),
               "hashlib": __import__("hashlib")})
    exec("from abc import ABC, abstractmethod\nfrom collections import Counter", ns)
    exec(compile(src[start:end], f"{name}-{version}:{member}", "exec"), ns)
    return ns


def engine_check() -> list[str]:
    vllm = engine_structs("vllm", "0.33.0", "vllm/distributed/kv_events.py")
    sgl = engine_structs("sglang", "0.5.23", "sglang/srt/disaggregation/kv_events.py")
    pairs = {"vllm_map": (vllm, "KVEventBatch"), "sglang_map": (sgl, "KVEventBatch")}
    checked = 0
    for case in CASES:
        gen = case["name"].split("/")[0]
        if gen not in pairs or case.get("reencode") is None:
            continue
        ns, batch_name = pairs[gen]
        raw = msgspec.msgpack.decode(bytes.fromhex(case["payload"]))
        batch = msgspec.msgpack.decode(bytes.fromhex(case["payload"]), type=ns[batch_name])
        again = msgspec.msgpack.encode(batch)
        assert again.hex() == case["payload"], f"{case['name']}: engine structs encode differently"
        assert len(raw) == 3
        checked += 1
    return [f"engine:vllm==0.33.0 (vllm/distributed/kv_events.py), engine:sglang==0.5.23 "
            f"(sglang/srt/disaggregation/kv_events.py): {checked} payloads re-encoded identically"]


def build(engine: bool) -> dict[str, Any]:
    CASES.clear()
    r = random.Random(20261122)
    zmq_cases(r)
    layout_cases(r)
    malformed_cases()
    proto_cases(r)
    trtllm_cases()
    refs = [f"msgspec=={msgspec.__version__}",
            f"protobuf=={importlib.metadata.version('protobuf')}",
            f"smg-grpc-proto=={importlib.metadata.version('smg-grpc-proto')} (smg.grpc.common messages)"]
    if engine:
        refs += engine_check()
    return {"generator": "scripts/gen_codec_fixtures.py", "references": refs, "cases": CASES}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", action="store_true", help="cross-check with the engines' own structs")
    ap.add_argument("--check", action="store_true", help="exit 1 if fixtures/codec.json is stale")
    args = ap.parse_args()
    data = build(args.engine)
    text = json.dumps(data, indent=1) + "\n"
    if args.check:
        old = json.loads(OUT.read_text())
        if old["cases"] != data["cases"]:
            print("fixtures/codec.json is stale: run scripts/gen_codec_fixtures.py", file=sys.stderr)
            return 1
        print(f"fixtures/codec.json is up to date ({len(data['cases'])} cases)")
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(REPO)}: {len(data['cases'])} cases; references: {data['references']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
