#!/usr/bin/env python3
"""A real grpcio peer of kvplane's gRPC stream, using the stubs SMG publishes (`smg-grpc-proto`).

  grpc_peer.py ADDRESS SERVICE START BATCHES [TOKEN]
      subscribe to SERVICE (vllm | sglang | trtllm | tokenspeed) at ADDRESS from START, print one
      JSON line {"epoch": "..."} with the initial metadata, then one JSON line per batch:
      {"seq": "...", "dp_rank": n|null, "events": [...]}, BATCHES of them; on a non-OK status
      print {"status": "CODE_NAME", "details": "..."} instead and stop. START "0+loads" subscribes
      from 0 with load_records_before_first_batch set.

  grpc_peer.py health ADDRESS SERVICE
      call HealthCheck on SERVICE and print {"healthy": bool, "message": "..."} (TensorRT-LLM:
      {"status": "..."}), or {"code": "CODE_NAME", "details": "..."} on a non-OK status.

  grpc_peer.py generate ADDRESS TEXT [MAX_TOKENS ROUNDS]
      one vLLM Generate of TEXT (max_tokens 1) and print {"outputs": n} once the stream ends, or
      {"code": ..., "details": ...}. With MAX_TOKENS and ROUNDS: ROUNDS streamed Generates of up
      to MAX_TOKENS tokens, one line each: {"chunks": n, "complete": bool} (the stream's chunks,
      and whether its last message was the GenerateComplete), or {"chunks": n, "code": ...,
      "details": ...} for one that ended with a status other than OK.

  grpc_peer.py bigheader ADDRESS SERVICE BYTES
      on one connection, a SubscribeKvEvents from 0 (its batches read as they come), then a
      HealthCheck carrying one header field of BYTES bytes. Prints {"health": "CODE_NAME", "secs": s}
      when the HealthCheck ends, then {"stream": "CODE_NAME", "batches": n, "secs": s} when the
      stream does (cancelled by the peer once the HealthCheck is OK and a batch came); secs
      count from the HealthCheck's start. Both calls have a 15 s deadline.

Snapshot chunks carry "snapshot": {"index", "count", "blocks"} as well ("unknown_before" when
it is not 0); batches with a load record carry "load": the EngineLoad fields that are set, by their
proto names (u64 sample as a decimal string).
Events are printed in a compact normalized form (u64 values as decimal strings): stored
{"type", "block_hashes", "parent_block_hash", "token_ids", "block_size"}, removed
{"type", "block_hashes"}, cleared {"type"}. Hashes are int64 on the wire; they print as u64.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import grpc
from google.protobuf import json_format
from smg_grpc_proto.generated import (
    common_pb2,
    sglang_scheduler_pb2,
    sglang_scheduler_pb2_grpc,
    tokenspeed_scheduler_pb2,
    tokenspeed_scheduler_pb2_grpc,
    trtllm_service_pb2,
    trtllm_service_pb2_grpc,
    vllm_engine_pb2,
    vllm_engine_pb2_grpc,
)

STUBS = {
    "vllm": vllm_engine_pb2_grpc.VllmEngineStub,
    "sglang": sglang_scheduler_pb2_grpc.SglangSchedulerStub,
    "trtllm": trtllm_service_pb2_grpc.TrtllmServiceStub,
    "tokenspeed": tokenspeed_scheduler_pb2_grpc.TokenSpeedSchedulerStub,
}

MESSAGES = {
    "vllm": vllm_engine_pb2,
    "sglang": sglang_scheduler_pb2,
    "trtllm": trtllm_service_pb2,
    "tokenspeed": tokenspeed_scheduler_pb2,
}


def u64(v: int) -> str:
    return str(v & 0xFFFF_FFFF_FFFF_FFFF)


def event(e: common_pb2.KvCacheEvent) -> dict:
    kind = e.WhichOneof("data")
    if kind == "stored":
        blocks = e.stored.blocks
        out = {
            "type": "stored",
            "block_hashes": [u64(b.block_hash) for b in blocks],
            "token_ids": [t for b in blocks for t in b.token_ids],
            "block_size": blocks[0].block_size if blocks else 0,
            "event_id": str(e.event_id),
        }
        if e.stored.HasField("parent_block_hash"):
            out["parent_block_hash"] = u64(e.stored.parent_block_hash)
        return out
    if kind == "removed":
        return {"type": "removed", "block_hashes": [u64(h) for h in e.removed.block_hashes],
                "event_id": str(e.event_id)}
    return {"type": kind, "event_id": str(e.event_id)}


def emit(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def health(address: str, service: str) -> None:
    with grpc.insecure_channel(address) as channel:
        try:
            r = STUBS[service](channel).HealthCheck(MESSAGES[service].HealthCheckRequest(), timeout=10)
        except grpc.RpcError as err:
            emit({"code": err.code().name, "details": err.details()})
            return
        if service == "trtllm":
            emit({"status": r.status})
        else:
            emit({"healthy": r.healthy, "message": r.message})


def big_header(address: str, service: str, size: int) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = STUBS[service](channel)
        call = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(start_sequence_number=0), timeout=15)
        call.initial_metadata()
        batches = []

        def read() -> None:
            try:
                for b in call:
                    batches.append(b.sequence_number)
            except grpc.RpcError:
                pass

        reader = threading.Thread(target=read)
        reader.start()
        t0 = time.monotonic()
        try:
            stub.HealthCheck(MESSAGES[service].HealthCheckRequest(), metadata=[("x-big", "a" * size)], timeout=15)
            emit({"health": "OK", "secs": round(time.monotonic() - t0, 2)})
            # The stream goes on: the peer cancels it once it has read a batch (within 5 s).
            until = time.monotonic() + 5
            while not batches and time.monotonic() < until:
                time.sleep(0.01)
            call.cancel()
        except grpc.RpcError as err:
            emit({"health": err.code().name, "secs": round(time.monotonic() - t0, 2)})
        reader.join()
        emit({"stream": call.code().name, "batches": len(batches), "secs": round(time.monotonic() - t0, 2)})


def generate_streamed(address: str, text: str, max_tokens: int, rounds: int) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
        for r in range(rounds):
            req = vllm_engine_pb2.GenerateRequest(
                request_id=f"r{r}", text=text, stream=True,
                sampling_params=vllm_engine_pb2.SamplingParams(max_tokens=max_tokens))
            chunks, complete = 0, False
            try:
                for m in stub.Generate(req, timeout=30):
                    complete = m.HasField("complete")
                    chunks += 0 if complete else 1
            except grpc.RpcError as err:
                emit({"chunks": chunks, "code": err.code().name, "details": err.details()})
                continue
            emit({"chunks": chunks, "complete": complete})


def generate(address: str, text: str) -> None:
    with grpc.insecure_channel(address) as channel:
        req = vllm_engine_pb2.GenerateRequest(request_id="warm-up", text=text,
                                              sampling_params=vllm_engine_pb2.SamplingParams(max_tokens=1))
        try:
            n = sum(1 for _ in vllm_engine_pb2_grpc.VllmEngineStub(channel).Generate(req, timeout=10))
        except grpc.RpcError as err:
            emit({"code": err.code().name, "details": err.details()})
            return
        emit({"outputs": n})


def main() -> None:
    if sys.argv[1] == "health":
        health(sys.argv[2], sys.argv[3])
        return
    if sys.argv[1] == "bigheader":
        big_header(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    if sys.argv[1] == "generate" and len(sys.argv) > 4:
        generate_streamed(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    if sys.argv[1] == "generate":
        generate(sys.argv[2], sys.argv[3])
        return
    address, service, batches = sys.argv[1], sys.argv[2], int(sys.argv[4])
    early = sys.argv[3].endswith("+loads")
    start = int(sys.argv[3].removesuffix("+loads"))
    metadata = [("authorization", f"Bearer {sys.argv[5]}")] if len(sys.argv) > 5 else None
    with grpc.insecure_channel(address) as channel:
        stub = STUBS[service](channel)
        call = stub.SubscribeKvEvents(
            common_pb2.SubscribeKvEventsRequest(start_sequence_number=start,
                                                load_records_before_first_batch=early),
            metadata=metadata
        )
        try:
            md = dict(call.initial_metadata())
            emit({"epoch": md.get("x-kvplane-epoch")})
            for i, b in enumerate(call):
                out = {"seq": str(b.sequence_number),
                       "dp_rank": b.dp_rank if b.HasField("dp_rank") else None,
                       "events": [event(e) for e in b.events]}
                if b.HasField("snapshot"):
                    out["snapshot"] = {"index": b.snapshot.index, "count": b.snapshot.count,
                                       "blocks": b.snapshot.blocks}
                    if b.snapshot.unknown_before:
                        out["snapshot"]["unknown_before"] = b.snapshot.unknown_before
                if b.HasField("load"):
                    out["load"] = {f.name: (str(v) if f.name == "sample" else
                                            json_format.MessageToDict(v) if f.message_type else v)
                                   for f, v in b.load.ListFields()}
                emit(out)
                if i + 1 >= batches:
                    call.cancel()
                    break
        except grpc.RpcError as err:
            emit({"status": err.code().name, "details": err.details()})


if __name__ == "__main__":
    main()
