#!/usr/bin/env python3
"""An SMG-proto KV-event server that is not kvplane: SMG's own vLLM servicer and messages
(smg-grpc-proto's `VllmEngineServicer`, `KvEventBatch`, ...) over grpcio, serving
`SubscribeKvEvents` from a log of batches it builds itself. No `x-kvplane-epoch`, no snapshot:
a subscriber from 0 gets the whole log, one from S gets S.. (OUT_OF_RANGE below the oldest kept).

  smg_kv_server.py [--keep N]

Prints {"grpc": "127.0.0.1:P"} when ready, then reads JSON commands from stdin, one per line,
answering each with {"ok": true}:

  {"op": "store", "rank": R, "hashes": [..], "parent": H | null}
        one batch with one BlockStored of the chain `hashes`, 16 tokens per block, all equal to
        the block's hash; medium "GPU" (cache_level 0)
  {"op": "remove", "rank": R, "hashes": [..]}
  {"op": "drop"}   ends every open stream with UNAVAILABLE (a lost connection)
  {"op": "epoch", "value": "..."}   streams opened from now on send `x-kvplane-epoch: value`
  {"op": "end_at_once", "on": true|false}   streams opened from now on end at once (status OK)
  {"op": "snapshot_stall", "on": true|false}   streams opened from 0 from now on send the first
        chunk of a two-chunk snapshot (a clear and block 100 on rank 0, at the log's last seq)
        and then nothing, the stream left open
  {"op": "exit"}
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent import futures

import grpc
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2_grpc

BLOCK_SIZE = 16


class Log:
    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.batches: list[common_pb2.KvEventBatch] = []
        self.next_seq = 1
        self.epoch = 0  # bumped by "drop": open streams end
        self.cond = threading.Condition()
        self.epoch_header: str | None = None
        self.end_at_once = False
        self.snapshot_stall = False

    def append(self, rank: int, event: common_pb2.KvCacheEvent) -> None:
        with self.cond:
            seq = self.next_seq
            self.next_seq += 1
            event.event_id = seq
            batch = common_pb2.KvEventBatch(
                sequence_number=seq, timestamp=time.time(), events=[event], dp_rank=rank
            )
            self.batches.append(batch)
            del self.batches[: max(0, len(self.batches) - self.keep)]
            self.cond.notify_all()


class Servicer(vllm_engine_pb2_grpc.VllmEngineServicer):
    def __init__(self, log: Log) -> None:
        self.log = log

    def SubscribeKvEvents(self, request, context):
        log = self.log
        start = request.start_sequence_number
        with log.cond:
            if log.epoch_header is not None:
                context.send_initial_metadata((("x-kvplane-epoch", log.epoch_header),))
            if log.end_at_once:
                return
            stall = log.snapshot_stall and start == 0
            last = log.next_seq - 1
        if stall:
            yield common_pb2.KvEventBatch(
                sequence_number=last,
                timestamp=time.time(),
                events=[common_pb2.KvCacheEvent(cleared=common_pb2.KvCacheCleared()), stored([100], None)],
                dp_rank=0,
                snapshot=common_pb2.KvSnapshotChunk(index=0, count=2, blocks=1),
            )
            while context.is_active():
                time.sleep(0.05)
            return
        with log.cond:
            oldest = log.batches[0].sequence_number if log.batches else log.next_seq
            if start != 0 and start < oldest:
                context.abort(
                    grpc.StatusCode.OUT_OF_RANGE,
                    f"expired KV event replay cursor: requested sequence {start}, "
                    f"oldest available sequence {oldest}",
                )
            nxt = oldest if start == 0 else start
            epoch = log.epoch
        while context.is_active():
            with log.cond:
                while log.epoch == epoch and nxt >= log.next_seq and context.is_active():
                    log.cond.wait(0.2)
                if log.epoch != epoch:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "stream dropped")
                ready = [b for b in log.batches if b.sequence_number >= nxt]
            for b in ready:
                yield b
                nxt = b.sequence_number + 1


def stored(hashes: list[int], parent: int | None) -> common_pb2.KvCacheEvent:
    blocks = [
        common_pb2.KvBlock(block_hash=h, token_ids=[h] * BLOCK_SIZE, block_size=BLOCK_SIZE, cache_level=0)
        for h in hashes
    ]
    ev = common_pb2.KvBlocksStored(blocks=blocks)
    if parent is not None:
        ev.parent_block_hash = parent
    return common_pb2.KvCacheEvent(stored=ev)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", type=int, default=1000)
    args = ap.parse_args()
    log = Log(args.keep)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(Servicer(log), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(json.dumps({"grpc": f"127.0.0.1:{port}"}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "store":
            log.append(cmd.get("rank", 0), stored(cmd["hashes"], cmd.get("parent")))
        elif op == "remove":
            ev = common_pb2.KvCacheEvent(removed=common_pb2.KvBlocksRemoved(block_hashes=cmd["hashes"], cache_level=0))
            log.append(cmd.get("rank", 0), ev)
        elif op == "drop":
            with log.cond:
                log.epoch += 1
                log.cond.notify_all()
        elif op == "epoch":
            log.epoch_header = cmd["value"]
        elif op == "end_at_once":
            log.end_at_once = cmd["on"]
        elif op == "snapshot_stall":
            log.snapshot_stall = cmd["on"]
        elif op == "exit":
            print(json.dumps({"ok": True}), flush=True)
            break
        print(json.dumps({"ok": True}), flush=True)
    server.stop(0)


if __name__ == "__main__":
    main()
