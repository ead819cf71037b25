"""The floor of any relay on this machine: libzmq's own proxy (zmq_proxy, C++, no Python per
message) from a SUB on the engine to a PUB, nothing decoded (bench/relay.mjs --only proxy).
Prints its endpoint.
    python3 bench/zmq_proxy.py SUB_ENDPOINT
"""

import json
import signal
import sys

import zmq

ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.setsockopt(zmq.RCVHWM, 10_000)
sub.setsockopt(zmq.LINGER, 0)
sub.connect(sys.argv[1])
sub.setsockopt(zmq.SUBSCRIBE, b"")
pub = ctx.socket(zmq.PUB)
pub.setsockopt(zmq.SNDHWM, 10_000)
pub.setsockopt(zmq.LINGER, 0)
pub.bind("tcp://127.0.0.1:*")
print(json.dumps({"endpoint": pub.getsockopt(zmq.LAST_ENDPOINT).decode()}), flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
zmq.proxy(sub, pub)
