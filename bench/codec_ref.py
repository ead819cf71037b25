#!/usr/bin/env python3
"""msgspec on the same vLLM payloads, for bench/codec.mjs: decode each payload into vLLM's
current structs (typed, as a Python consumer does), then encode those structs back (what vLLM's
publisher does per batch), best of N rounds; checks the bytes round-trip. Prints JSON.

    python3 bench/codec_ref.py payloads.bin [rounds]
"""
import json
import struct
import sys
import time
from pathlib import Path
from typing import Union

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import gen_codec_fixtures as g  # noqa: E402

gen = g.MAPS["vllm_map"]
Event = Union[gen["BlockStored"], gen["BlockRemoved"], gen["AllBlocksCleared"]]
Batch = msgspec.defstruct("KVEventBatch", [("ts", float), ("events", list[Event]),
                                            ("data_parallel_rank", Union[int, None], None)], array_like=True)


def main() -> None:
    data = Path(sys.argv[1]).read_bytes()
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    payloads, at = [], 0
    while at < len(data):
        (n,) = struct.unpack_from("<I", data, at)
        payloads.append(data[at + 4:at + 4 + n])
        at += 4 + n
    dec = msgspec.msgpack.Decoder(Batch)
    enc = msgspec.msgpack.Encoder()
    events = sum(len(dec.decode(p).events) for p in payloads)
    best_dec = best_enc = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        batches = [dec.decode(p) for p in payloads]
        best_dec = min(best_dec, time.perf_counter() - t)
        t = time.perf_counter()
        out = [enc.encode(b) for b in batches]
        best_enc = min(best_enc, time.perf_counter() - t)
        assert out == payloads, "msgspec re-encoding differs"
    print(json.dumps({"events": events, "decode_s": best_dec, "encode_s": best_enc,
                      "msgspec": msgspec.__version__}))


if __name__ == "__main__":
    main()
