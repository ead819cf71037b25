#!/usr/bin/env python3
"""Build, offline, a word-level tokenizer whose ids are predictable, for SMG's --tokenizer-path.

  build_tokenizer.py DIR [--vocab N]

Word `tK` (0 <= K < N) is token id K; the special tokens follow the words: `<unk>` = N,
`<s>` = N + 1 (BOS, never added), `</s>` = N + 2 (EOS). The pre-tokenizer splits on whitespace
and punctuation (`tokenizers`' `Whitespace`: \\w+ | [^\\w\\s]+), so the prompt "t1 t2 t3" encodes to
[1, 2, 3], and a word that is not `tK` with K < N encodes to `<unk>`. Decoding joins words with
single spaces, so [1, 2, 3] decodes to "t1 t2 t3".

Files written to DIR (what SMG's tokenizer factory reads from a local directory):
  tokenizer.json          the tokenizer (required: SMG loads a directory through it)
  tokenizer_config.json   special tokens, add_bos_token/add_eos_token false, the chat template
  chat_template.jinja     the same chat template (SMG discovers it in the directory)
  config.json             eos/bos ids and vocab size (SMG reads EOS ids from config.json)
  generation_config.json  eos/bos ids

The chat template renders every message's content followed by a space, so a chat request whose
messages hold `t...` words tokenizes to exactly those words' ids.
"""

from __future__ import annotations

import argparse
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['content'] is string %}{{ message['content'] }} "
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }} {% endif %}"
    "{% endfor %}{% endif %}"
    "{% endfor %}"
)


def build(out_dir: str, vocab_size: int) -> dict:
    if vocab_size < 1:
        raise SystemExit("build_tokenizer: --vocab must be at least 1")
    unk, bos, eos = vocab_size, vocab_size + 1, vocab_size + 2
    vocab = {f"t{i}": i for i in range(vocab_size)}
    vocab["<unk>"] = unk
    vocab["<s>"] = bos
    vocab["</s>"] = eos

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    # Join decoded words with one space (WordPiece's decoder with an empty prefix does exactly
    # that and strips nothing else); without a decoder `tokenizers` joins with spaces as well,
    # but an explicit decoder keeps every consumer (Rust and Python) on the same rule.
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])

    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1_000_000,
        "unk_token": "<unk>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<unk>",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(i): {"content": c, "special": True, "lstrip": False, "rstrip": False,
                     "normalized": False, "single_word": False}
            for i, c in ((unk, "<unk>"), (bos, "<s>"), (eos, "</s>"))
        },
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config, f, indent=2)
    with open(os.path.join(out_dir, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE + "\n")
    config = {
        "model_type": "llama",
        "vocab_size": vocab_size + 3,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": unk,
        "max_position_embeddings": 1_000_000,
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": bos, "eos_token_id": eos}, f, indent=2)

    # Self-check: the ids are the words' numbers, and decoding gives the words back.
    check = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    words = [0, 1, vocab_size - 1]
    text = " ".join(f"t{i}" for i in words)
    ids = check.encode(text).ids
    if ids != words or check.decode(ids) != text:
        raise SystemExit(f"build_tokenizer: self-check failed: {text!r} -> {ids} -> {check.decode(ids)!r}")
    return {"dir": os.path.abspath(out_dir), "vocab": vocab_size, "unk": unk, "bos": bos, "eos": eos,
            "vocab_size": vocab_size + 3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--vocab", type=int, default=32000, help="number of tK words (default 32000)")
    args = ap.parse_args()
    print(json.dumps(build(args.dir, args.vocab)), flush=True)


if __name__ == "__main__":
    main()
