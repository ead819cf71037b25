#!/usr/bin/env python3
"""The baseline of bench/publish.mjs: a Python publisher built the way vLLM's ZmqEventPublisher
is (msgspec structs, a bounded queue.Queue, a publisher thread that encodes each batch with
msgspec and sends [topic, seq, payload] on a pyzmq PUB socket, keeping (seq, payload) in a
bounded replay deque). The same workload as the JS side: 1024-event batches of single-block
stored events (16 tokens) alternating with removals. A SUB in this process's own thread is not
used; the subscriber is a separate process (bench/publish_sub.mjs), as for the JS side.

    python3 bench/publish_ref.py ENDPOINT EVENTS   -> JSON {events, seconds, events_per_sec}
"""
import json
import queue
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Union

import msgspec
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import gen_codec_fixtures as g  # noqa: E402

gen = g.MAPS["vllm_map"]
BlockStored, BlockRemoved = gen["BlockStored"], gen["BlockRemoved"]
Event = Union[gen["BlockStored"], gen["BlockRemoved"], gen["AllBlocksCleared"]]
Batch = msgspec.defstruct("KVEventBatch", [("ts", float), ("events", list[Event]),
                                            ("data_parallel_rank", Union[int, None], None)], array_like=True)
BATCH = 1024
WINDOW = 4096


def workload(n_events: int) -> list:
    """n_events events in batches of BATCH: store block i (chains of 64), remove block i - WINDOW."""
    x = 0x9E3779B97F4A7C15
    hashes = []
    events = []
    i = -1
    while len(events) < n_events:
        i += 1
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        hashes.append(x)
        parent = hashes[i - 1] if i % 64 else None
        events.append(BlockStored(block_hashes=[x], parent_block_hash=parent,
                                  token_ids=[(x >> s) & 0x7FFF for s in range(16)], block_size=16,
                                  lora_id=None, medium="GPU", lora_name=None))
        if i >= WINDOW and len(events) < n_events:
            events.append(BlockRemoved(block_hashes=[hashes[i - WINDOW]], medium="GPU"))
    return [Batch(ts=time.time(), events=events[i:i + BATCH]) for i in range(0, len(events), BATCH)]


def main() -> None:
    endpoint, n_events = sys.argv[1], int(sys.argv[2])
    batches = workload(n_events)
    total = sum(len(b.events) for b in batches)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.bind(endpoint)
    time.sleep(1.0)  # let the subscriber connect
    q: "queue.Queue" = queue.Queue(maxsize=100_000)
    replay: deque = deque(maxlen=10_000)
    done = threading.Event()

    def publisher() -> None:
        enc = msgspec.msgpack.Encoder()
        seq = 0
        topic = b""
        while True:
            b = q.get()
            if b is None:
                break
            payload = enc.encode(b)
            seq += 1
            sock.send_multipart((topic, seq.to_bytes(8, "big"), payload), copy=False)
            replay.append((seq, payload))
        done.set()

    t = threading.Thread(target=publisher, daemon=True)
    t0 = time.perf_counter()
    t.start()
    for b in batches:
        q.put(b)
    q.put(None)
    done.wait()
    seconds = time.perf_counter() - t0
    print(json.dumps({"events": total, "batches": len(batches), "seconds": seconds,
                      "events_per_sec": total / seconds}))
    time.sleep(0.5)
    sock.close(linger=1000)


if __name__ == "__main__":
    main()
