#!/usr/bin/env python3
"""llama.cpp's perplexity of a GGUF over a text, by the method `veil-shard
perplexity` uses (llama-perplexity's): the text tokenized once, BOS first
where the model adds one; non-overlapping windows of --ctx tokens, each from
an empty cache with its first token replaced by BOS where the model adds one;
the second half of each window scored. Ends with `perplexity: X`.

--save-logits FILE writes the scored positions' log-probabilities in the file
format `veil-shard perplexity --kl-base` reads, so Veil's distributions can be
compared with llama.cpp's on the same file (KL divergence, top-1 agreement).

  scripts/perplexity-llamacpp.py --model M.gguf --file TEXT [--ctx 512]
      [--chunks N] [--threads 2] [--save-logits FILE] [--save-scores FILE]

--save-scores FILE writes each scored position's log-probability of the
token that follows it, one per line (as `veil-shard perplexity --save-scores`).

Needs llama-cpp-python (built for this CPU: CMAKE_ARGS="-DGGML_NATIVE=ON").
"""
import argparse
import struct
import sys

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save-logits")
    ap.add_argument("--save-scores")
    args = ap.parse_args()

    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=args.model,
        n_ctx=args.ctx,
        n_batch=args.ctx,
        n_ubatch=args.ctx,
        logits_all=True,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        verbose=False,
    )
    text = open(args.file, encoding="utf-8").read()
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    bos = llm.token_bos()
    adds_bos = len(tokens) > 0 and tokens[0] == bos and llm._model.add_bos_token()
    fit = len(tokens) // args.ctx
    chunks = min(fit, args.chunks) if args.chunks else fit
    if chunks == 0:
        print(f"the text has {len(tokens)} tokens, fewer than one window", file=sys.stderr)
        return 1
    first = args.ctx // 2
    scored = args.ctx - first - 1
    vocab = llm.n_vocab()
    print(f"{len(tokens)} tokens, {chunks} windows of {args.ctx}", file=sys.stderr)
    out = None
    if args.save_logits:
        out = open(args.save_logits, "wb")
        out.write(b"VEILLGP1")
        out.write(struct.pack("<III", args.ctx, vocab, chunks * scored))
        out.write(np.asarray(tokens[: chunks * args.ctx], dtype="<u4").tobytes())
    nll, count = 0.0, 0
    scores = []
    for c in range(chunks):
        window = list(tokens[c * args.ctx : (c + 1) * args.ctx])
        if adds_bos:
            window[0] = bos
        llm.reset()
        llm.eval(window)
        logits = np.asarray(llm.scores[: args.ctx], dtype=np.float64)
        for j in range(first, args.ctx - 1):
            row = logits[j]
            m = row.max()
            lp = row - m - np.log(np.exp(row - m).sum())
            nll -= lp[window[j + 1]]
            scores.append(lp[window[j + 1]])
            count += 1
            if out:
                out.write(lp.astype("<f2").tobytes())
        print(f"  window {c + 1}/{chunks}: ppl {np.exp(nll / count):.4f}", file=sys.stderr)
    if out:
        out.close()
    if args.save_scores:
        with open(args.save_scores, "w") as f:
            f.writelines(f"{v:.6f}\n" for v in scores)
    print(f"scored: {count}")
    print(f"perplexity: {np.exp(nll / count):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
