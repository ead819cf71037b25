#!/usr/bin/env python3
"""A vLLM engine stand-in for SMG's gRPC router: SMG's vLLM servicer (`vllm.grpc.engine.VllmEngine`
from smg-grpc-proto) over grpcio, with vLLM's own KV-event publisher on ZMQ.

  smg_engine.py [--grpc-port P] [--zmq-port Z] [--replay-port R | --no-replay] [--block-size 16]
                [--model NAME] [--tokenizer-dir DIR] [--num-blocks N] [--output-tokens K]
                [--token-delay-ms MS] [--fail-after K] [--hash-algo sha256|sha256_cbor]
                [--bytes-hashes]

Ports default to free ones. When ready it prints one JSON line:
  {"grpc": "127.0.0.1:P", "grpc_port": P, "zmq": "tcp://127.0.0.1:Z", "zmq_port": Z,
   "replay": "tcp://127.0.0.1:R" | null, "replay_port": R | null, "block_size": B, "model": NAME}

RPCs: HealthCheck, GetModelInfo, GetServerInfo, GetLoads, Generate, Abort, FlushCache and
GetTokenizer (a zip of --tokenizer-dir). SubscribeKvEvents is deliberately not implemented
(UNIMPLEMENTED): kvplane relays the ZMQ events and serves that RPC.

Tokenizer: GetModelInfo reports model_path = tokenizer_path = --tokenizer-dir, or both empty
without it. SMG loads a worker's tokenizer from those labels first and falls back to its own
--tokenizer-path only when both are empty, so either give SMG --tokenizer-path DIR (and this
script no --tokenizer-dir), or give both the same DIR (scripts/build_tokenizer.py DIR).

The KV cache is simulated the way vLLM's prefix cache behaves, and every change is published
through vLLM 0.33.0's ZmqEventPublisher (loaded from the installed wheel by engine_peer.load_vllm):
  - a Generate's prompt is cut into full blocks of --block-size tokens (a partial last block is
    not cached). Block i's hash is vLLM's: hash_fn((parent_hash, tuple(tokens_i), None)) with
    parent_hash = block i-1's hash, or NONE_HASH = hash_fn(PYTHONHASHSEED or "vllm-none-hash")
    for block 0; hash_fn is vLLM's own `sha256` (pickle) by default. Published hashes are ints
    (the hash's last 8 bytes big-endian, vLLM's default VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1) or,
    with --bytes-hashes, the 32 bytes.
  - the leading blocks already cached are a prefix hit (cached_tokens in the response); the
    blocks from the first miss on are stored with ONE BlockStored event: block_hashes = the new
    blocks' hashes, parent_block_hash = the hash of the block before the first new one (None when
    the store starts at block 0), token_ids = the new blocks' tokens (len = blocks x block size),
    block_size, medium "GPU", group_idx 0. So every stored block's parent is known to a consumer
    that saw the earlier stores, which is what SMG's index needs (SMG places a store whose parent
    it does not hold as a new chain at position 0: the prompt it belongs to then misses, and a
    prompt that starts with those blocks' tokens matches them).
  - the cache holds --num-blocks blocks; past that the least recently used blocks are evicted
    with one BlockRemoved event (medium "GPU"). A prompt's blocks are touched tail first (vLLM
    frees a request's blocks in reverse order), so children are evicted before their parents.
  - FlushCache clears the cache and publishes AllBlocksCleared.
  The store is published when the request arrives, before its first token, as vLLM does after
  the scheduler step that allocated the blocks.

Generation: K tokens (--output-tokens, or sampling_params.max_tokens if smaller), token j is
(last prompt id + 1 + j) mod vocab, one every --token-delay-ms. As SMG's vLLM servicer does:
with stream=true one GenerateStreamChunk per token (delta token_ids, completion_tokens = 1), and
after the last chunk a GenerateComplete whose output_ids are that last delta; with stream=false one
GenerateComplete with all output ids. finish_reason "length" when max_tokens cut the output,
else "stop". n > 1 produces n outputs (index 0..n-1), each the same tokens.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import signal
import socket
import sys
import threading
import time
import zipfile
from collections import OrderedDict
from concurrent import futures
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grpc  # noqa: E402
from engine_peer import load_vllm  # noqa: E402
from smg_grpc_proto.generated import common_pb2  # noqa: E402
from smg_grpc_proto.generated import vllm_engine_pb2 as pb  # noqa: E402
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc  # noqa: E402

VLLM_VERSION = "0.33.0"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json",
                   "generation_config.json", "special_tokens_map.json")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def log(msg: str) -> None:
    print(f"[smg_engine {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class KvCache:
    """vLLM's prefix cache, reduced to what its KV events show: hashed full blocks, LRU eviction."""

    def __init__(self, ev, publisher, block_size: int, num_blocks: int, hash_algo: str,
                 bytes_hashes: bool) -> None:
        import vllm.utils.hashing as hashing  # the wheel's own hash functions

        self.ev = ev
        self.publisher = publisher
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.hash_fn = {"sha256": hashing.sha256, "sha256_cbor": hashing.sha256_cbor}[hash_algo]
        self.none_hash = self.hash_fn(os.getenv("PYTHONHASHSEED") or "vllm-none-hash")
        self.bytes_hashes = bytes_hashes
        self.blocks: OrderedDict[bytes, None] = OrderedDict()  # LRU: oldest first
        self.lock = threading.Lock()
        self.stored_blocks = 0
        self.removed_blocks = 0

    def external(self, h: bytes) -> int | bytes:
        # vllm.v1.core.kv_cache_utils.maybe_convert_block_hash
        return h if self.bytes_hashes else int.from_bytes(h, "big") & ((1 << 64) - 1)

    def block_hashes(self, tokens: list[int]) -> list[bytes]:
        """vllm.v1.core.kv_cache_utils.hash_block_tokens over the prompt's full blocks."""
        out: list[bytes] = []
        parent = self.none_hash
        bs = self.block_size
        for i in range(len(tokens) // bs):
            h = self.hash_fn((parent, tuple(tokens[i * bs:(i + 1) * bs]), None))
            out.append(h)
            parent = h
        return out

    def admit(self, tokens: list[int]) -> tuple[int, int, list[bytes]]:
        """Cache the prompt's full blocks and publish the events.

        Returns (cached prefix blocks, newly stored blocks, evicted hashes)."""
        bs = self.block_size
        hashes = self.block_hashes(tokens)
        with self.lock:
            hit = 0
            while hit < len(hashes) and hashes[hit] in self.blocks:
                hit += 1
            new = hashes[hit:]
            events = []
            if new:
                parent = self.external(hashes[hit - 1]) if hit > 0 else None
                events.append(self.ev.BlockStored(
                    block_hashes=[self.external(h) for h in new],
                    parent_block_hash=parent,
                    token_ids=list(tokens[hit * bs:len(hashes) * bs]),
                    block_size=bs,
                    lora_id=None,
                    medium="GPU",
                    lora_name=None,
                    group_idx=0,
                ))
                self.stored_blocks += len(new)
            # Touch the prompt's blocks tail first, as vLLM frees a request's blocks in reverse
            # order: a block is always more recent than its descendants, so eviction takes
            # children before parents and never leaves a cached block with an evicted parent.
            for h in reversed(hashes):
                self.blocks[h] = None
                self.blocks.move_to_end(h)
            evicted = []
            protected = set(hashes)
            while len(self.blocks) > self.num_blocks:
                victim = next((h for h in self.blocks if h not in protected), None)
                if victim is None:
                    break
                del self.blocks[victim]
                evicted.append(victim)
            if evicted:
                events.append(self.ev.BlockRemoved(block_hashes=[self.external(h) for h in evicted],
                                                   medium="GPU", group_idx=0))
                self.removed_blocks += len(evicted)
            if events:
                self.publisher.publish(self.ev.KVEventBatch(ts=time.time(), events=events))
            return hit, len(new), evicted

    def clear(self) -> int:
        with self.lock:
            n = len(self.blocks)
            self.blocks.clear()
            self.publisher.publish(self.ev.KVEventBatch(ts=time.time(), events=[self.ev.AllBlocksCleared()]))
            return n


class Engine(pb_grpc.VllmEngineServicer):
    def __init__(self, args, cache: KvCache) -> None:
        self.args = args
        self.cache = cache
        self.start_time = time.time()
        self.last_receive = 0.0
        self.lock = threading.Lock()
        self.running: dict[str, int] = {}  # request id -> prompt blocks held
        self.aborted: set[str] = set()
        self.requests = 0

    # ---- management ----

    def HealthCheck(self, request, context):
        return pb.HealthCheckResponse(healthy=True, message="Health")

    def GetModelInfo(self, request, context):
        a = self.args
        return pb.GetModelInfoResponse(
            # Empty unless --tokenizer-dir: SMG takes a worker's tokenizer from these labels
            # (tokenizer_path, then model_path) before its own --tokenizer-path.
            model_path=a.tokenizer_dir or "",
            is_generation=True,
            max_context_length=a.max_model_len,
            vocab_size=a.vocab + 3,
            supports_vision=False,
            served_model_name=a.model,
            tokenizer_path=a.tokenizer_dir or "",
            model_type="llama",
            architectures=["LlamaForCausalLM"],
            eos_token_ids=[a.vocab + 2],
            pad_token_id=0,
            bos_token_id=a.vocab + 1,
            max_req_input_len=a.max_model_len,
            default_sampling_params_json="",
        )

    def GetServerInfo(self, request, context):
        with self.lock:
            active = len(self.running)
        return pb.GetServerInfoResponse(
            active_requests=active,
            is_paused=False,
            last_receive_timestamp=self.last_receive,
            uptime_seconds=time.time() - self.start_time,
            server_type="vllm-grpc",
            data_parallel_size=1,
            kv_cache_dtype="auto",
            block_size=self.args.block_size,
            model_dtype="torch.bfloat16",
            max_num_seqs=self.args.max_num_seqs,
        )

    def GetLoads(self, request, context):
        with self.lock:
            running = len(self.running)
            held = sum(self.running.values())
        usage = min(held / self.args.num_blocks, 0.999) if self.args.num_blocks else 0.0
        load = pb.SchedulerLoad(
            dp_rank=0,
            num_running_reqs=running,
            num_waiting_reqs=0,
            num_total_reqs=running,
            num_used_tokens=held * self.args.block_size,
            max_total_num_tokens=self.args.num_blocks * self.args.block_size,
            token_usage=usage,
            max_running_requests=self.args.max_num_seqs,
        )
        return pb.GetLoadsResponse(timestamp=datetime.now(timezone.utc).isoformat(),
                                   version=VLLM_VERSION, dp_rank_count=1, loads=[load])

    def Abort(self, request, context):
        with self.lock:
            self.aborted.update(rid for rid in request.request_ids if rid in self.running)
        if self.args.verbose:
            log(f"Abort {list(request.request_ids)}")
        return pb.AbortResponse()

    def FlushCache(self, request, context):
        n = self.cache.clear()
        return common_pb2.FlushCacheResponse(success=True, message=f"cleared {n} blocks")

    def GetTokenizer(self, request, context):
        d = self.args.tokenizer_dir
        if not d:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "Tokenizer path is not configured on this server.")
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            for name in TOKENIZER_FILES:
                p = os.path.join(d, name)
                if os.path.isfile(p):
                    z.write(p, name)
        data = buf.getvalue()
        digest = hashlib.sha256(data).hexdigest()
        step = 512 * 1024
        for off in range(0, len(data), step):
            last = off + step >= len(data)
            yield common_pb2.GetTokenizerChunk(data=data[off:off + step], sha256=digest if last else "")

    # ---- generation ----

    def _prompt(self, request) -> list[int]:
        kind = request.WhichOneof("input")
        if kind == "tokenized":
            return list(request.tokenized.input_ids)
        if kind == "text":  # the stand-in's own word-level rule: tK -> K
            ids = []
            for w in request.text.split():
                ids.append(int(w[1:]) if w[:1] == "t" and w[1:].isdigit() and int(w[1:]) < self.args.vocab
                           else self.args.vocab)
            return ids
        return []

    def Generate(self, request, context):
        rid = request.request_id
        self.last_receive = time.time()
        prompt = self._prompt(request)
        sp = request.sampling_params
        hit, stored, evicted = self.cache.admit(prompt)
        bs = self.args.block_size
        cached_tokens = hit * bs
        with self.lock:
            self.running[rid] = len(prompt) // bs
            self.requests += 1
        want = self.args.output_tokens
        finish = "stop"
        if sp.HasField("max_tokens") and sp.max_tokens < want:
            want = sp.max_tokens
            finish = "length"
        n = max(1, sp.n)
        last = prompt[-1] if prompt else 0
        out = [(last + 1 + j) % self.args.vocab for j in range(want)]
        if self.args.verbose:
            log(f"Generate {rid}: prompt {len(prompt)} tokens, {len(prompt) // bs} full blocks, "
                f"{hit} cached, {stored} stored, {len(evicted)} evicted, stream={request.stream} n={n}")
        delay = self.args.token_delay_ms / 1000.0
        try:
            for index in range(n):
                for j, tok in enumerate(out):
                    if delay:
                        time.sleep(delay)
                    if rid in self.aborted or not context.is_active():
                        return
                    if self.args.fail_after is not None and j == self.args.fail_after:
                        context.abort(grpc.StatusCode.INTERNAL, f"engine failed after {j} chunks")
                    if request.stream:
                        yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(
                            token_ids=[tok], prompt_tokens=len(prompt), completion_tokens=1,
                            cached_tokens=cached_tokens, index=index))
                if request.stream:
                    # vLLM DELTA mode: the Complete carries the last delta; SMG accumulates.
                    tail = out[-1:]
                    yield pb.GenerateResponse(complete=pb.GenerateComplete(
                        output_ids=tail, finish_reason=finish, prompt_tokens=len(prompt),
                        completion_tokens=len(tail), cached_tokens=cached_tokens, index=index))
                else:
                    yield pb.GenerateResponse(complete=pb.GenerateComplete(
                        output_ids=out, finish_reason=finish, prompt_tokens=len(prompt),
                        completion_tokens=len(out), cached_tokens=cached_tokens, index=index))
        finally:
            with self.lock:
                self.running.pop(rid, None)
                self.aborted.discard(rid)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1", help="gRPC bind address (default 127.0.0.1)")
    ap.add_argument("--grpc-port", type=int, default=0, help="gRPC port (default: a free one)")
    ap.add_argument("--zmq-port", type=int, default=0, help="ZMQ PUB port, bound as tcp://*:PORT (default: free)")
    ap.add_argument("--replay-port", type=int, default=0, help="ZMQ replay ROUTER port (default: free)")
    ap.add_argument("--no-replay", action="store_true", help="no replay socket")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--model", default="kvplane-test", help="served model name (default kvplane-test)")
    ap.add_argument("--tokenizer-dir", default=None, help="served by GetTokenizer, reported as model/tokenizer path")
    ap.add_argument("--vocab", type=int, default=32000, help="tK words of the tokenizer (build_tokenizer --vocab)")
    ap.add_argument("--num-blocks", type=int, default=8192, help="KV cache capacity in blocks (LRU eviction)")
    ap.add_argument("--output-tokens", type=int, default=8, help="tokens generated per request (max)")
    ap.add_argument("--token-delay-ms", type=float, default=2.0, help="delay before each generated token")
    ap.add_argument("--fail-after", type=int, default=None,
                    help="a Generate ends INTERNAL after this many tokens (a failing engine)")
    ap.add_argument("--max-model-len", type=int, default=131072)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--hash-algo", choices=["sha256", "sha256_cbor"], default="sha256",
                    help="vLLM --prefix-caching-hash-algo (default sha256)")
    ap.add_argument("--bytes-hashes", action="store_true",
                    help="publish 32-byte hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)")
    ap.add_argument("--buffer-steps", type=int, default=10_000)
    ap.add_argument("--hwm", type=int, default=100_000)
    ap.add_argument("--topic", default="")
    ap.add_argument("--workers", type=int, default=64, help="gRPC thread pool size")
    ap.add_argument("--verbose", action="store_true", help="log every Generate to stderr")
    args = ap.parse_args()
    if args.block_size < 1:
        ap.error("--block-size must be at least 1")

    ev = load_vllm()
    zmq_port = args.zmq_port or free_port()
    replay_port = None if args.no_replay else (args.replay_port or free_port())
    publisher = ev.ZmqEventPublisher(
        data_parallel_rank=0,
        endpoint=f"tcp://*:{zmq_port}",
        replay_endpoint=f"tcp://*:{replay_port}" if replay_port else None,
        buffer_steps=args.buffer_steps,
        hwm=args.hwm,
        topic=args.topic,
    )
    cache = KvCache(ev, publisher, args.block_size, args.num_blocks, args.hash_algo, args.bytes_hashes)
    engine = Engine(args, cache)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=args.workers),
                         options=[("grpc.max_receive_message_length", 64 << 20),
                                  ("grpc.max_send_message_length", 64 << 20)])
    pb_grpc.add_VllmEngineServicer_to_server(engine, server)
    grpc_port = server.add_insecure_port(f"{args.host}:{args.grpc_port}")
    if grpc_port == 0:
        sys.exit(f"smg_engine: cannot bind {args.host}:{args.grpc_port}")
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.stop(0))
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "[::]") else args.host
    print(json.dumps({
        "grpc": f"{host}:{grpc_port}", "grpc_port": grpc_port,
        "zmq": f"tcp://127.0.0.1:{zmq_port}", "zmq_port": zmq_port,
        "replay": f"tcp://127.0.0.1:{replay_port}" if replay_port else None, "replay_port": replay_port,
        "block_size": args.block_size, "model": args.model,
    }), flush=True)
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop(1)
        publisher.shutdown()
        if args.verbose:
            log(f"exit: {engine.requests} requests, {cache.stored_blocks} blocks stored, "
                f"{cache.removed_blocks} removed")


if __name__ == "__main__":
    main()
