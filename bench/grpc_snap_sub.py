#!/usr/bin/env python3
"""One SubscribeKvEvents subscriber from 0 on grpcio (gRPC's C core, as the SMG gateway's tonic is
a native client), for bench/smg.mjs --snapshot-client python: every message parsed as SMG's
KvEventBatch (smg-grpc-proto). Prints "ready" once the stream's headers come (as grpc_sub.mjs),
then, at the first live batch after the snapshot, one JSON line shaped as grpc_sub.mjs's:
{"subscribers": [{"snapshotChunks", "subscribed", "firstLive", "batches"}]} (times in ms since
the epoch).

    python3 bench/grpc_snap_sub.py ADDRESS
"""

import json
import sys
import time

import grpc
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2_grpc


def main() -> None:
    channel = grpc.insecure_channel(sys.argv[1], options=[("grpc.max_receive_message_length", -1)])
    stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
    subscribed = time.time() * 1000
    call = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(start_sequence_number=0))
    call.initial_metadata()
    print("ready", flush=True)
    chunks = 0
    for b in call:
        if b.HasField("snapshot"):
            chunks += 1
            continue
        first_live = time.time() * 1000
        print(json.dumps({"subscribers": [{"snapshotChunks": chunks, "subscribed": subscribed,
                                           "firstLive": first_live, "batches": 1}]}), flush=True)
        call.cancel()
        break
    channel.close()


if __name__ == "__main__":
    main()
