#!/usr/bin/env python3
"""Regenerates enclave/testdata/spm_tokenizer_fixtures.json with llama.cpp.

A sentencepiece-style ("llama") vocabulary is small enough to define here:
byte-fallback tokens, control tokens, and scored pieces. The script writes it
as a vocab-only GGUF with gguf-py, has llama.cpp (llama-cpp-python) tokenize
and detokenize a set of texts with it, and stores vocabulary and results as
JSON. The Rust test rebuilds the same GGUF from the JSON and must produce the
same ids and text. CI does not run this; the JSON is committed.

    pip install llama-cpp-python==0.3.36 gguf
    python3 scripts/reference/gen_spm_fixtures.py
"""
import json
import os
import sys
import tempfile

import gguf
from llama_cpp import Llama, __version__

PIECES = [
    # (piece, score): higher scores merge first.
    ("▁", -1.0), ("e", -2.0), ("t", -2.1), ("a", -2.2), ("o", -2.3), ("i", -2.4), ("n", -2.5),
    ("s", -2.6), ("h", -2.7), ("r", -2.8), ("l", -2.9), ("d", -3.0), ("w", -3.1), ("c", -3.2),
    ("u", -3.3), ("m", -3.4), ("f", -3.5), ("g", -3.6), ("y", -3.7), ("p", -3.8), ("b", -3.9),
    ("H", -4.0), ("W", -4.1), ("T", -4.2), (",", -4.3), (".", -4.4), ("!", -4.5), ("1", -4.6),
    ("2", -4.7), ("é", -4.8),
    ("▁t", -5.0), ("he", -5.1), ("▁the", -5.2), ("▁th", -5.3), ("in", -5.4), ("ing", -5.5),
    ("▁a", -5.6), ("er", -5.7), ("ll", -5.8), ("▁w", -5.9), ("or", -6.0), ("ld", -6.1),
    ("▁H", -6.2), ("el", -6.3), ("lo", -6.4), ("llo", -6.5), ("▁Hello", -6.6), ("▁wor", -6.7),
    ("▁world", -6.8), ("an", -6.9), ("▁an", -7.0), ("nd", -7.1), ("▁and", -7.2), ("on", -7.3),
    ("at", -7.4), ("▁s", -7.5), ("en", -7.6), ("es", -7.7), ("▁c", -7.8), ("af", -7.9),
    ("▁caf", -8.0), ("▁café", -8.1), ("▁▁", -8.2), ("12", -8.3), ("st", -8.4), ("is", -8.5),
    ("▁is", -8.6), ("▁T", -8.7), ("▁The", -8.8),
]
TEXTS = [
    "Hello world",
    "Hello, world!",
    "the cat and the hat",
    "The café is 12 steps away.",
    "  two leading spaces",
    "tabs\tand\nnewlines",
    "emoji 🙂 falls back to bytes",
    "Ünïcödé without pieces",
    "<s>special</s> in text",
]


def vocabulary():
    tokens, scores, types = [], [], []
    for text, kind in (("<unk>", gguf.TokenType.UNKNOWN), ("<s>", gguf.TokenType.CONTROL), ("</s>", gguf.TokenType.CONTROL)):
        tokens.append(text)
        scores.append(0.0)
        types.append(int(kind))
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(int(gguf.TokenType.BYTE))
    for piece, score in PIECES:
        tokens.append(piece)
        scores.append(score)
        types.append(int(gguf.TokenType.NORMAL))
    return tokens, scores, types


def write_gguf(path, tokens, scores, types):
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(out: str) -> None:
    tokens, scores, types = vocabulary()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "spm.gguf")
        write_gguf(path, tokens, scores, types)
        llm = Llama(model_path=path, vocab_only=True, verbose=False)
        cases = []
        for text in TEXTS:
            for special in (False, True):
                ids = llm.tokenize(text.encode(), add_bos=True, special=special)
                # Detokenize the ids after BOS, as generated text is.
                pieces = b"".join(llm.detokenize([i], special=False) for i in ids[1:])
                cases.append({"text": text, "parse_special": special, "ids": ids,
                              "decoded": pieces.decode("utf-8", errors="replace")})
    doc = {
        "generator": f"scripts/reference/gen_spm_fixtures.py with llama-cpp-python {__version__}",
        "tokens": tokens, "scores": scores, "types": types,
        "bos": 1, "eos": 2, "unk": 0, "add_bos": True, "add_space_prefix": True,
        "cases": cases,
    }
    with open(out, "w") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "enclave/testdata/spm_tokenizer_fixtures.json")
