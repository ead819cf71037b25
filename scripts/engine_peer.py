#!/usr/bin/env python3
"""A real engine's KV-event publisher: vLLM's or SGLang's own ZmqEventPublisher and event structs,
loaded from the installed wheels (scripts/requirements-engines.txt, installed with --no-deps).

  engine_peer.py vllm|sglang [--dp-size N] [--no-replay] [--buffer-steps N] [--topic T]
                             [--port BASE] [--replay-port RBASE] [--hwm N]

Binds one PUB (and one replay ROUTER) per data-parallel rank the way the engine does: the
configured endpoint is `tcp://*:BASE` and rank r binds BASE + r (free ports unless given: pass
the ports of an earlier run to restart the engine in place). Prints one JSON line
{"endpoint": "tcp://127.0.0.1:BASE", "replay": "tcp://127.0.0.1:RBASE" | null}, then reads JSON
commands from stdin, one per line, and answers each with one JSON line:

  {"op": "store", "rank": R, "hashes": [..], "parent": H | null, "per_batch": K}
        BlockStored events of the chain `hashes` (each block's parent the one before it), K blocks
        per batch (default: all in one batch); 16 tokens per block, all equal to the block's hash
        modulo 2^31; with "chain": false each batch is a new root instead
  {"op": "remove", "rank": R, "hashes": [..]}
  {"op": "clear", "rank": R}
  {"op": "sync"}  waits until every batch published so far has been sent (and is replayable)
  {"op": "exit"}

Each batch is the engine's EventBatch, published through the engine's publisher: the engine
numbers it (from 0), encodes it with msgspec, sends it and keeps it for replay.

Loading without torch: the packages' own __init__ files import torch and most of the engine, so
the packages are entered as bare modules whose __path__ is the installed folder. vLLM's
vllm/config/utils.py imports torch without using it at import time, so `torch` is an empty
module when it is not installed, and vllm/v1/core/kv_cache_utils.py (which builds on the whole
engine) is replaced by the one name kv_events.py takes from it, the type alias
`ExternalBlockHash = bytes | int`. Everything else that runs is the wheel's code.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import sys
import time
import types

BLOCK_SIZE = 16


def bare_package(name: str) -> None:
    """Enter package `name` (and its parents) without running their __init__ files."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        full = ".".join(parts[:i])
        if full in sys.modules:
            continue
        if i == 1:
            spec = importlib.util.find_spec(full)
            if spec is None or spec.submodule_search_locations is None:
                sys.exit(f"engine_peer: {full} is not installed: "
                         "python3 -m pip install --no-deps -r scripts/requirements-engines.txt")
            path = list(spec.submodule_search_locations)
        else:
            path = [os.path.join(p, parts[i - 1]) for p in sys.modules[".".join(parts[: i - 1])].__path__]
        module = types.ModuleType(full)
        module.__path__ = path
        sys.modules[full] = module


def load_vllm() -> types.ModuleType:
    if importlib.util.find_spec("torch") is None:
        sys.modules["torch"] = types.ModuleType("torch")
    for package in ("vllm.distributed", "vllm.config", "vllm.utils", "vllm.v1.core"):
        bare_package(package)
    alias = types.ModuleType("vllm.v1.core.kv_cache_utils")
    alias.ExternalBlockHash = bytes | int
    sys.modules["vllm.v1.core.kv_cache_utils"] = alias
    import vllm.distributed.kv_events as kv_events

    return kv_events


def load_sglang() -> types.ModuleType:
    for package in ("sglang.srt.disaggregation", "sglang.srt.utils"):
        bare_package(package)
    import sglang.srt.disaggregation.kv_events as kv_events

    return kv_events


def free_base_port(count: int) -> int:
    """A port P such that P .. P + count - 1 are free on every interface right now."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        held = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                held.append(s)
                s.bind(("", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    sys.exit("engine_peer: no free port range")


class Engine:
    def __init__(self, kind: str, dp_size: int, ports: tuple[int | None, int | None], replay: bool,
                 buffer_steps: int, topic: str, hwm: int) -> None:
        self.kind = kind
        self.ev = load_vllm() if kind == "vllm" else load_sglang()
        base = ports[0] or free_base_port(dp_size)
        rbase = (ports[1] or free_base_port(dp_size)) if replay else None
        self.endpoint = f"tcp://127.0.0.1:{base}"
        self.replay = f"tcp://127.0.0.1:{rbase}" if rbase is not None else None
        self.publishers = []
        for rank in range(dp_size):
            # The engine's own constructor offsets the ports by the rank.
            kwargs = dict(endpoint=f"tcp://*:{base}",
                          replay_endpoint=f"tcp://*:{rbase}" if rbase is not None else None,
                          buffer_steps=buffer_steps, topic=topic, hwm=hwm)
            if kind == "vllm":
                self.publishers.append(self.ev.ZmqEventPublisher(data_parallel_rank=rank, **kwargs))
            else:
                self.publishers.append(self.ev.ZmqEventPublisher(attn_dp_rank=rank, **kwargs))

    def batch(self, rank: int, events: list) -> None:
        if self.kind == "vllm":
            b = self.ev.KVEventBatch(ts=time.time(), events=events, data_parallel_rank=rank)
        else:
            b = self.ev.KVEventBatch(ts=time.time(), events=events, attn_dp_rank=rank)
        self.publishers[rank].publish(b)

    def stored(self, hashes: list[int], parent: int | None) -> object:
        tokens = [t for h in hashes for t in [h % (1 << 31)] * BLOCK_SIZE]
        if self.kind == "vllm":
            return self.ev.BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens,
                                       block_size=BLOCK_SIZE, lora_id=None, medium="GPU", lora_name=None)
        return self.ev.BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens,
                                   block_size=BLOCK_SIZE, lora_id=None, medium="GPU")

    def run(self, cmd: dict) -> dict:
        op = cmd["op"]
        rank = int(cmd.get("rank", 0))
        if op == "store":
            hashes = [int(h) for h in cmd["hashes"]]
            parent = cmd.get("parent")
            per = int(cmd.get("per_batch") or len(hashes))
            chain = cmd.get("chain", True)
            for i in range(0, len(hashes), per):
                chunk = hashes[i : i + per]
                self.batch(rank, [self.stored(chunk, parent)])
                if chain:
                    parent = chunk[-1]
        elif op == "remove":
            self.batch(rank, [self.ev.BlockRemoved(block_hashes=[int(h) for h in cmd["hashes"]], medium="GPU")])
        elif op == "clear":
            self.batch(rank, [self.ev.AllBlocksCleared()])
        elif op == "sync":
            for p in self.publishers:
                p._event_queue.join()  # task_done() follows the send and the replay-buffer append
        elif op == "exit":
            for p in self.publishers:
                p.shutdown()
        else:
            return {"error": f"unknown op {op!r}"}
        return {"ok": True}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("engine", choices=["vllm", "sglang"])
    ap.add_argument("--dp-size", type=int, default=1)
    ap.add_argument("--no-replay", action="store_true")
    ap.add_argument("--buffer-steps", type=int, default=10_000)
    ap.add_argument("--topic", default="")
    ap.add_argument("--port", type=int)
    ap.add_argument("--replay-port", type=int)
    ap.add_argument("--hwm", type=int, default=100_000)
    args = ap.parse_args()
    engine = Engine(args.engine, args.dp_size, (args.port, args.replay_port), not args.no_replay,
                    args.buffer_steps, args.topic, args.hwm)
    print(json.dumps({"endpoint": engine.endpoint, "replay": engine.replay}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        print(json.dumps(engine.run(cmd)), flush=True)
        if cmd["op"] == "exit":
            return
    for p in engine.publishers:
        p.shutdown()


if __name__ == "__main__":
    main()
