#!/usr/bin/env python3
"""Checks proto/common.proto against SMG's published common.proto (smg-grpc-proto,
requirements-fixtures.txt): every message and enum kvplane declares must have exactly the
upstream's fields (label, type, name, number) and reserved numbers. Comments are ignored.

    python3 scripts/check_proto.py     # exit 1 and list the differences when they diverge
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import smg_grpc_proto

OURS = Path(__file__).resolve().parent.parent / "proto" / "common.proto"
THEIRS = Path(smg_grpc_proto.__file__).resolve().parent / "proto" / "common.proto"

FIELD = re.compile(r"^(optional |repeated )?([\w.]+) (\w+) = (\d+);$")
ENUM_VALUE = re.compile(r"^(\w+) = (-?\d+);$")


def declarations(path: Path) -> dict[str, set[str]]:
    """Top-level message and enum names -> their fields, enum values and reserved numbers."""
    text = re.sub(r"//[^\n]*", "", path.read_text())
    out: dict[str, set[str]] = {}
    stack: list[str] = []
    for raw in text.splitlines():
        line = " ".join(raw.split())
        if not line:
            continue
        head = re.match(r"^(message|enum|oneof) (\w+) \{$", line)
        if head:
            kind, name = head.groups()
            if kind == "oneof":
                stack.append(stack[-1])
                out[stack[-1]].add(f"oneof {name}")
            else:
                stack.append(name)
                out[name] = set()
            continue
        if line == "}":
            stack.pop()
            continue
        if not stack:
            continue
        owner = out[stack[-1]]
        if line.startswith("reserved "):
            owner.add(line)
        elif FIELD.match(line) or ENUM_VALUE.match(line):
            owner.add(line)
    return out


def main() -> int:
    ours, theirs = declarations(OURS), declarations(THEIRS)
    problems = []
    for name, fields in sorted(ours.items()):
        if name not in theirs:
            problems.append(f"{name}: not in smg-grpc-proto's common.proto")
            continue
        for f in sorted(fields - theirs[name]):
            problems.append(f"{name}: ours only: {f}")
        for f in sorted(theirs[name] - fields):
            problems.append(f"{name}: upstream only: {f}")
    if problems:
        print(f"{OURS} diverges from {THEIRS}:", *problems, sep="\n  ", file=sys.stderr)
        return 1
    print(f"proto/common.proto: {len(ours)} declarations match smg-grpc-proto")
    return 0


if __name__ == "__main__":
    sys.exit(main())
