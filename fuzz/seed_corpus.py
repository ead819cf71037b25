#!/usr/bin/env python3
"""Write fixtures/codec.json payloads into fuzz/corpus/decode (dialect byte first)."""
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent
DIALECTS = ["vllm", "sglang", "trtllm", "trtllm_json", "smg_proto"]
out = ROOT / "corpus" / "decode"
out.mkdir(parents=True, exist_ok=True)
for i, case in enumerate(json.loads((ROOT.parent / "fixtures" / "codec.json").read_text())["cases"]):
    payload = bytes.fromhex(case["payload"])
    if len(payload) < 20000:
        (out / f"seed-{i:03}").write_bytes(bytes([DIALECTS.index(case["dialect"])]) + payload)
