#!/usr/bin/env python3
"""Mean KL divergence and top-1 agreement between two saved log-probability
files of the same model over the same windows (`veil-shard perplexity
--save-logits` or `scripts/perplexity-llamacpp.py --save-logits`): KL(A ‖ B),
A the base. Two llama.cpp builds on the same file give llama.cpp's own noise
floor, against which Veil's KL from llama.cpp is read.

  scripts/kl-between.py A.lgp B.lgp
"""
import struct
import sys

import numpy as np

MAGIC = b"VEILLGP1"


def read(path):
    with open(path, "rb") as f:
        if f.read(8) != MAGIC:
            sys.exit(f"{path}: not a saved log-probability file")
        ctx, vocab, positions = struct.unpack("<3I", f.read(12))
        scored = ctx - ctx // 2 - 1
        tokens = np.frombuffer(f.read(4 * (positions // scored) * ctx), dtype="<u4")
        rows = np.frombuffer(f.read(2 * vocab * positions), dtype="<f2").reshape(positions, vocab)
    return (ctx, vocab, positions), tokens, rows


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) == 2 else 2
    head_a, tokens_a, a = read(sys.argv[1])
    head_b, tokens_b, b = read(sys.argv[2])
    if head_a != head_b or not np.array_equal(tokens_a, tokens_b):
        sys.exit("the files were saved over other windows, tokens or vocabularies")
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    p = np.exp(a)
    kl = np.where(np.isfinite(a), p * (a - b), 0.0).sum(axis=1).clip(min=0.0)
    agree = (a.argmax(axis=1) == b.argmax(axis=1)).mean()
    print(f"positions: {len(kl)}")
    print(f"kl_divergence: {kl.mean():.6f}")
    print(f"top1_agreement: {agree:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
