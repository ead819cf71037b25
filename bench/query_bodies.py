#!/usr/bin/env python3
"""Large query bodies, kvplane's indexer and Dynamo's side by side.

  npm run build && python3 bench/query_bodies.py [ROUNDS]

Starts `kvplane indexer` (dist/cli.js) and Dynamo's standalone indexer (`python -m dynamo.indexer`
from ai-dynamo-runtime, one thread) on free loopback ports, registers one worker on each, then per
body and per indexer: ROUNDS (default 5) large bodies posted back to back by one thread while the
main thread times small `/query`s (64 tokens) on another connection. Printed per line: the large
bodies' times, and the small queries' count, p50 and max while they ran (how long other requests
wait behind a large one). Bodies: a `/query_by_hash` of 390,000 i64 hashes (7.9 MB) and a `/query`
of 700,000 token ids (7.5 MB), the same bytes to both. The index is empty: what is timed is the
reading of the body and the answer, not a match.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, path: str, body: bytes, timeout: float = 60) -> tuple[int, float]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t = time.perf_counter()
    c.request("POST", path, body, {"content-type": "application/json"})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status, (time.perf_counter() - t) * 1000


def wait_up(port: int) -> None:
    for _ in range(300):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit(f"nothing answers on port {port}")


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    random.seed(5)
    hashes = ",".join(str(random.randrange(-(2**63), 2**63)) for _ in range(390_000))
    by_hash = ('{"model_name":"m","block_hashes":[' + hashes + "]}").encode()
    tokens = json.dumps({"model_name": "m", "token_ids": [random.randrange(2**32) for _ in range(700_000)]},
                        separators=(",", ":")).encode()
    small = json.dumps({"model_name": "m", "token_ids": list(range(64))}).encode()
    kv_port, dyn_port = free_port(), free_port()
    procs = {
        "kvplane": subprocess.Popen(["node", os.path.join(ROOT, "dist/cli.js"), "indexer", "--host", "127.0.0.1",
                                     "--port", str(kv_port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        "dynamo": subprocess.Popen([sys.executable, "-m", "dynamo.indexer", "--port", str(dyn_port), "--threads", "1"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    }
    ports = {"kvplane": kv_port, "dynamo": dyn_port}
    try:
        reg = json.dumps({"instance_id": 1, "endpoint": "tcp://127.0.0.1:9", "model_name": "m", "block_size": 16})
        for name, port in ports.items():
            wait_up(port)
            status, _ = post(port, "/register", reg.encode())
            assert status == 201, (name, status)
        for label, path, body in (("query_by_hash, 390,000 hashes", "/query_by_hash", by_hash),
                                  ("query, 700,000 tokens", "/query", tokens)):
            for name, port in ports.items():
                big: list[float] = []
                done = threading.Event()

                def hammer() -> None:
                    for _ in range(rounds):
                        status, ms = post(port, path, body)
                        assert status == 200, (name, path, status)
                        big.append(ms)
                    done.set()

                t = threading.Thread(target=hammer)
                t.start()
                waits: list[float] = []
                while not done.is_set():
                    waits.append(post(port, "/query", small)[1])
                t.join()
                waits.sort()
                print(f"{label} ({len(body):,} bytes) -> {name}: {', '.join(f'{ms:.0f}' for ms in big)} ms; "
                      f"small /query meanwhile: {len(waits)}, p50 {waits[len(waits) // 2]:.1f} ms, "
                      f"max {waits[-1]:.1f} ms", flush=True)
    finally:
        for p in procs.values():
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
