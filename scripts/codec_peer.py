#!/usr/bin/env python3
"""Decode kvplane's encodings with the reference libraries (a peer for the codec tests).

Reads {"cases": [{"format": ..., "hex": ...}]} on stdin and prints, per case, the batch in the
normalized JSON form of fixtures/codec.json, or {"error": ...}:

* vllm / vllm_legacy / sglang: msgspec, typed with vLLM's current structs, vLLM's last legacy
  array structs or SGLang's current structs (strict: a wrong type or a missing field fails);
* smg_proto: the official protobuf runtime with SMG's KvEventBatch (smg-grpc-proto).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Union

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_codec_fixtures as g  # noqa: E402

MEDIUM_OF_TIER = {1: "GPU", 2: "CPU", 3: "DISK", 4: "EXTERNAL"}
LOCALITY = {1: "LOCAL", 2: "REMOTE"}


def typed_batch(gen: dict[str, Any]):
    Event = Union[gen["BlockStored"], gen["BlockRemoved"], gen["AllBlocksCleared"]]  # noqa: N806
    return msgspec.defstruct("Batch", [("ts", float), ("events", list[Event]),
                                       ("data_parallel_rank", Union[int, None], None)], array_like=True)


BATCH = {"vllm": typed_batch(g.MAPS["vllm_map"]), "vllm_legacy": typed_batch(g.LEGACY["array12"]),
         "sglang": typed_batch(g.MAPS["sglang_map"])}


def msgpack_case(fmt: str, payload: bytes) -> dict[str, Any]:
    b = msgspec.msgpack.decode(payload, type=BATCH[fmt])
    events = []
    for ev in b.events:
        name = type(ev).__name__
        if name == "AllBlocksCleared":
            events.append({"type": "cleared"})
            continue
        f = msgspec.structs.asdict(ev)
        events.append(g.norm_stored(f) if name == "BlockStored" else g.norm_removed(f))
    return {"ts": b.ts, "dp_rank": b.data_parallel_rank, "events": events}


def signed_u64(v: int) -> str:
    return str(v & g.U64)


def proto_case(payload: bytes) -> dict[str, Any]:
    m = g.pb.KvEventBatch.FromString(payload)
    events = []
    for ev in m.events:
        kind = ev.WhichOneof("data")
        if kind == "stored":
            st = ev.stored
            out: dict[str, Any] = {"type": "stored", "block_hashes": [signed_u64(b.block_hash) for b in st.blocks]}
            if st.HasField("parent_block_hash"):
                out["parent_block_hash"] = signed_u64(st.parent_block_hash)
            out["token_ids"] = [t for b in st.blocks for t in b.token_ids]
            out["block_size"] = st.blocks[0].block_size if st.blocks else 0
            if st.blocks and st.blocks[0].HasField("lora_id"):
                out["lora_id"] = str(st.blocks[0].lora_id)
            medium = st.medium if st.HasField("medium") else MEDIUM_OF_TIER.get(st.tier)
            if medium is not None:
                out["medium"] = medium
            for k in ("lora_name", "cache_salt", "kv_cache_spec_kind", "ownership", "session_id"):
                if st.HasField(k):
                    out[k] = getattr(st, k)
            if st.HasField("locality"):
                out["locality"] = LOCALITY[st.locality]
            if st.HasField("group_idx"):
                out["group_idx"] = st.group_idx
            if st.HasField("kv_cache_spec_sliding_window"):
                out["kv_cache_spec_sliding_window"] = str(st.kv_cache_spec_sliding_window)
            keys = [[k.text if k.WhichOneof("key") == "text" else [k.multimodal.identifier, k.multimodal.offset]
                     for k in b.extra_keys] or None for b in st.blocks]
            if any(keys):
                out["extra_keys"] = keys
            events.append(out)
        elif kind == "removed":
            rm = ev.removed
            out = {"type": "removed", "block_hashes": [signed_u64(h) for h in rm.block_hashes]}
            medium = rm.medium if rm.HasField("medium") else MEDIUM_OF_TIER.get(rm.tier)
            if medium is not None:
                out["medium"] = medium
            for k in ("group_idx", "ownership"):
                if rm.HasField(k):
                    out[k] = getattr(rm, k)
            if rm.HasField("locality"):
                out["locality"] = LOCALITY[rm.locality]
            events.append(out)
        elif kind == "cleared":
            events.append({"type": "cleared"})
    return {"seq": str(m.sequence_number), "ts": m.timestamp,
            "dp_rank": m.dp_rank if m.HasField("dp_rank") else None, "events": events,
            "event_ids": [str(e.event_id) for e in m.events]}


def main() -> None:
    req = json.load(sys.stdin)
    out = []
    for c in req["cases"]:
        payload = bytes.fromhex(c["hex"])
        try:
            out.append(proto_case(payload) if c["format"] == "smg_proto" else msgpack_case(c["format"], payload))
        except Exception as e:  # a peer refusing our bytes is the test's finding
            out.append({"error": f"{type(e).__name__}: {e}"})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
