#!/usr/bin/env python3
"""A Python KV-event relay, built the way Dynamo-based tees are (the baseline for bench/relay.mjs).

    python3 scripts/python_relay.py --sub tcp://127.0.0.1:A --pub tcp://127.0.0.1:B [--worker-id 0]

pyzmq SUB (connects to the engine, everything subscribed) -> msgspec decode into vLLM's current
structs -> every event applied to Dynamo's own radix tree (ai-dynamo-runtime, dynamo._core.RadixTree)
-> the batch re-encoded with msgspec and re-published on a pyzmq PUB (bound), as
[topic, seq, payload]. Prints `ready` once the sockets are up; on SIGTERM/SIGINT prints one JSON
line {"batches", "events", "errors"} and exits 0. Single-threaded, on purpose.

RadixTree.apply_event(worker_id, bytes) takes Dynamo's KvCacheEvent as JSON (the binding does
serde_json::from_slice::<KvCacheEvent>, lib/bindings/python/rust/llm/kv.rs; the types are in
lib/kv-router/src/protocols.rs):
    {"event_id": u64, "dp_rank": u32,
     "data": {"stored": {"parent_hash": u64|null, "blocks": [{"block_hash": u64, "tokens_hash": u64}]}}
           | {"removed": {"block_hashes": [u64]}}
           | "cleared"}
(all checked against the installed ai-dynamo-runtime 1.6.1). The conversion from vLLM's events
follows Dynamo's own vLLM ZMQ listener (BlockHashValue::into_u64, convert_event,
create_stored_blocks; lib/llm/src/kv_router/publisher.rs in Dynamo's tree).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Union

import msgspec
import zmq
from dynamo._core import RadixTree, compute_block_hash_for_seq

# vLLM's current KVEventBatch / BlockStored / BlockRemoved / AllBlocksCleared, field for field
# (the same definitions the codec fixtures and bench/codec_ref.py use).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_codec_fixtures as g  # noqa: E402

_vllm = g.MAPS["vllm_map"]
BlockStored = _vllm["BlockStored"]
BlockRemoved = _vllm["BlockRemoved"]
AllBlocksCleared = _vllm["AllBlocksCleared"]
KVEventBatch = msgspec.defstruct(
    "KVEventBatch",
    [("ts", float), ("events", list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]),
     ("data_parallel_rank", Union[int, None], None)],
    array_like=True,
)

U64 = (1 << 64) - 1


class Stop(Exception):
    pass


def on_signal(signum, frame):
    raise Stop()


def to_u64(h: int | bytes) -> int:
    """vLLM block hash -> Dynamo's u64: negative ints wrap; bytes -> last 8 bytes, big-endian."""
    if isinstance(h, bytes):
        return int.from_bytes(h[-8:], "big")
    return h & U64


def dynamo_event(ev, event_id: int, dp_rank: int) -> dict:
    """vLLM event -> Dynamo KvCacheEvent (as a dict, JSON-encoded by the caller)."""
    if isinstance(ev, BlockStored):
        # tokens_hash is Dynamo's LocalBlockHash computed by Dynamo itself: compute_block_hash_for_seq
        # = XXH3-64 of each block's token ids as little-endian u32s, seed 1337 (LoRA name mixed into
        # the seed when set), one hash per full block, exactly what its vLLM listener does.
        tokens_hashes = compute_block_hash_for_seq(ev.token_ids, ev.block_size, lora_name=ev.lora_name)
        blocks = [{"block_hash": to_u64(h), "tokens_hash": t}
                  for h, t in zip(ev.block_hashes, tokens_hashes)]
        parent = None if ev.parent_block_hash is None else to_u64(ev.parent_block_hash)
        data = {"stored": {"parent_hash": parent, "blocks": blocks}}
    elif isinstance(ev, BlockRemoved):
        data = {"removed": {"block_hashes": [to_u64(h) for h in ev.block_hashes]}}
    else:  # AllBlocksCleared
        data = "cleared"
    return {"event_id": event_id, "data": data, "dp_rank": dp_rank}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sub", required=True, help="engine endpoint to connect the SUB to")
    ap.add_argument("--pub", required=True, help="endpoint to bind the PUB on")
    ap.add_argument("--worker-id", type=int, default=0)
    args = ap.parse_args()

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(args.sub)
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.bind(args.pub)

    tree = RadixTree()
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    encoder = msgspec.msgpack.Encoder()
    counters = {"batches": 0, "events": 0, "errors": 0}

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print("ready", flush=True)

    try:
        while True:
            frames = sub.recv_multipart()
            if len(frames) != 3:
                counters["errors"] += 1
                continue
            topic, seq_bytes, payload = frames
            try:
                batch = decoder.decode(payload)
            except msgspec.DecodeError:
                counters["errors"] += 1
                continue
            seq = int.from_bytes(seq_bytes, "big")  # event_id == the batch's seq, as the tee does
            dp_rank = batch.data_parallel_rank or 0
            for ev in batch.events:
                try:
                    tree.apply_event(args.worker_id, msgspec.json.encode(dynamo_event(ev, seq, dp_rank)))
                except (ValueError, RuntimeError):
                    counters["errors"] += 1
                counters["events"] += 1
            pub.send_multipart([topic, seq_bytes, encoder.encode(batch)])
            counters["batches"] += 1
    except Stop:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        sub.close(linger=0)
        pub.close(linger=0)
        ctx.term()
    print(json.dumps(counters), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
