#!/usr/bin/env python3
"""A real pyzmq peer of kvplane's ZMQ stream, decoding with msgspec and vLLM's struct definitions.

  zmq_peer.py sub ENDPOINT BATCHES [PREFIX]
                                        subscribe (to PREFIX, default everything), print "ready",
                                        then one JSON line per batch:
                                        {"seq": "...", "topic": "...", "batch": <normalized>}
  zmq_peer.py replay ENDPOINT START dealer|req [topic|notopic]
                                        ask the replay ROUTER for batches from START and print one
                                        JSON line per reply, then {"end": true} at the end marker
                                        (a REQ socket sees only the first reply)
  zmq_peer.py certs DIR                 write CURVE certificates with pyzmq's zmq.auth:
                                        DIR/server.key(_secret) and DIR/clients/client.key,
                                        DIR/client.key_secret, DIR/stranger.key_secret (not allowed)

With KVPLANE_CURVE_CLIENT (a client's .key_secret) and KVPLANE_CURVE_SERVER (the server's .key)
set, sub and replay connect with CURVE.

The structs are the vLLM generation structs of gen_codec_fixtures.py, which `--engine` checks
byte for byte against vllm/distributed/kv_events.py of the vLLM wheel.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from codec_peer import msgpack_case  # noqa: E402

END = b"\xff" * 8


def emit(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def socket(ctx: zmq.Context, kind: int) -> zmq.Socket:
    s = ctx.socket(kind)
    client, server = os.environ.get("KVPLANE_CURVE_CLIENT"), os.environ.get("KVPLANE_CURVE_SERVER")
    if client and server:
        import zmq.auth

        public, secret = zmq.auth.load_certificate(client)
        s.curve_publickey, s.curve_secretkey = public, secret
        s.curve_serverkey = zmq.auth.load_certificate(server)[0]
    return s


def certs(directory: str) -> None:
    import zmq.auth

    os.makedirs(os.path.join(directory, "clients"), exist_ok=True)
    zmq.auth.create_certificates(directory, "server")
    zmq.auth.create_certificates(directory, "stranger")
    public, _ = zmq.auth.create_certificates(directory, "client")
    os.replace(public, os.path.join(directory, "clients", "client.key"))
    emit({"server_public": zmq.auth.load_certificate(os.path.join(directory, "server.key"))[0].decode()})


def sub(endpoint: str, batches: int, prefix: str = "") -> None:
    ctx = zmq.Context()
    s = socket(ctx, zmq.SUB)
    s.setsockopt(zmq.RCVHWM, 0)
    s.connect(endpoint)
    s.setsockopt(zmq.SUBSCRIBE, prefix.encode())
    time.sleep(0.2)
    emit("ready")
    for _ in range(batches):
        topic, seq, payload = s.recv_multipart()
        emit({"seq": str(int.from_bytes(seq, "big")), "topic": topic.decode(),
              "batch": msgpack_case("vllm", payload)})


def replay(endpoint: str, start: int, kind: str, topic_frame: bool) -> None:
    ctx = zmq.Context()
    s = socket(ctx, zmq.DEALER if kind == "dealer" else zmq.REQ)
    s.setsockopt(zmq.RCVTIMEO, 10_000)
    s.connect(endpoint)
    if kind == "dealer":
        s.send_multipart([b"", start.to_bytes(8, "big")])
    else:
        s.send(start.to_bytes(8, "big"))
    while True:
        frames = s.recv_multipart()
        if kind == "dealer":
            frames = frames[1:]  # the empty delimiter
        if topic_frame:
            frames = frames[1:]
        seq, payload = frames
        if seq == END:
            emit({"end": True})
            return
        emit({"seq": str(int.from_bytes(seq, "big")), "batch": msgpack_case("vllm", payload)})
        if kind == "req":
            return


if __name__ == "__main__":
    if sys.argv[1] == "certs":
        certs(sys.argv[2])
    elif sys.argv[1] == "sub":
        sub(sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "")
    else:
        replay(sys.argv[2], int(sys.argv[3]), sys.argv[4], len(sys.argv) < 6 or sys.argv[5] == "topic")
