#!/usr/bin/env python3
"""GetLoads answers and EngineLoad records through the official protobuf runtime, with the
messages smg-grpc-proto publishes (a peer for the load-record tests).

  loads_peer.py answer SERVICE
      print {"hex": ...}: a GetLoadsResponse of SERVICE (vllm | sglang | tokenspeed) for DP
      ranks 0 and 1, every SchedulerLoad field the service has set (rank r adds r to the counts)
  loads_peer.py record HEX
      read HEX as a KvEventBatch and print its `load` (EngineLoad) by proto field names
"""

from __future__ import annotations

import json
import sys

from google.protobuf import json_format
from smg_grpc_proto.generated import (
    common_pb2,
    sglang_scheduler_pb2,
    tokenspeed_scheduler_pb2,
    vllm_engine_pb2,
)

MODULES = {"vllm": vllm_engine_pb2, "sglang": sglang_scheduler_pb2, "tokenspeed": tokenspeed_scheduler_pb2}


def scheduler_load(mod, rank: int):
    load = mod.SchedulerLoad(
        dp_rank=rank, num_running_reqs=3 + rank, num_waiting_reqs=4 + rank, num_total_reqs=7,
        num_used_tokens=5000 + rank, max_total_num_tokens=6000, token_usage=0.25, gen_throughput=99.5,
        cache_hit_rate=0.5, utilization=0.75, max_running_requests=256, num_waiting_uncached_tokens=900 + rank,
    )
    fields = mod.SchedulerLoad.DESCRIPTOR.fields_by_name
    if "memory" in fields:
        load.memory.weight_gb = 1.5
        load.memory.token_capacity = 7
    if "queues" in fields:
        load.queues.waiting = 2
        load.queues.paused = 1
    if "speculative" in fields:
        load.speculative.accept_rate = 0.875
    if "lora" in fields:
        load.lora.slots_used = 1
    if "disaggregation" in fields:
        load.disaggregation.mode = "prefill"
    if "active_token_usage" in fields:
        load.active_token_usage = 0.125
    return load


def main() -> None:
    if sys.argv[1] == "answer":
        mod = MODULES[sys.argv[2]]
        answer = mod.GetLoadsResponse(timestamp="2026-11-28T00:00:00Z", dp_rank_count=2,
                                      loads=[scheduler_load(mod, 0), scheduler_load(mod, 1)])
        print(json.dumps({"hex": answer.SerializeToString().hex()}))
    elif sys.argv[1] == "record":
        batch = common_pb2.KvEventBatch.FromString(bytes.fromhex(sys.argv[2]))
        print(json.dumps(json_format.MessageToDict(batch.load, preserving_proto_field_name=True)))


if __name__ == "__main__":
    main()
