"""Python references for the hashing bench: vLLM's and SGLang's block hashing as the engines run
it (pickle/cbor2 + hashlib/xxhash per block, chained). Reads a u32 LE token file and prints
the best time per request (see main).

usage: python3 bench/hash_ref.py <tokens.u32le> <block_size>
"""
import array
import hashlib
import json
import pickle
import sys
import time

import cbor2
import xxhash


def vllm_chain(hash_fn):
    def run(tokens, bs):
        parent = hash_fn("vllm-none-hash")
        out = []
        for i in range(0, len(tokens) - bs + 1, bs):
            parent = hash_fn((parent, tuple(tokens[i:i + bs]), None))
            out.append(int.from_bytes(parent[-8:], "big"))
        return out
    return run


def sglang(tokens, bs):
    out, prev = [], None
    for i in range(0, len(tokens) - bs + 1, bs):
        h = hashlib.sha256()
        if prev is not None:
            h.update(prev)
        h.update(array.array("I", tokens[i:i + bs]).tobytes())
        prev = h.digest()
        out.append(int.from_bytes(prev[:8], "big"))
    return out


ALGOS = {
    "vllm_sha256": vllm_chain(lambda x: hashlib.sha256(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)).digest()),
    "vllm_sha256_cbor": vllm_chain(lambda x: hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()),
    "vllm_xxhash": vllm_chain(lambda x: xxhash.xxh3_128_digest(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL))),
    "vllm_xxhash_cbor": vllm_chain(lambda x: xxhash.xxh3_128_digest(cbor2.dumps(x, canonical=True))),
    "sglang_sha256": sglang,
}


def main():
    """Serve timing requests: each stdin line names an algorithm; the answer is one JSON line
    with the best of `runs` timings, so the bench can interleave this with its own runs."""
    path, bs = sys.argv[1], int(sys.argv[2])
    tokens = array.array("I")
    with open(path, "rb") as f:
        tokens.frombytes(f.read())
    tokens = tokens.tolist()
    for line in sys.stdin:
        name, _, runs = line.strip().partition(" ")
        fn = ALGOS[name]
        best = float("inf")
        for _ in range(max(1, int(runs or 1))):
            t = time.perf_counter()
            out = fn(tokens, bs)
            best = min(best, time.perf_counter() - t)
        print(json.dumps({"seconds": best, "first": str(out[0]), "last": str(out[-1])}), flush=True)


if __name__ == "__main__":
    main()
