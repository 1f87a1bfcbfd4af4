#!/usr/bin/env python3
"""Regenerates enclave/testdata/family_fixtures.json: llama.cpp's answers on
random-weight models of each served family and quantisation.

Needs llama-cpp-python (PyPI; builds llama.cpp from source, slow on 2 cores),
a built `veil-shard`, and llama.cpp's vocabulary GGUFs:
    pip install llama-cpp-python==0.3.36
    cargo build --release -p veil-enclave --bin veil-shard
    python3 scripts/reference/gen_family_fixtures.py target/release/veil-shard ../shared/llamacpp-reference/vocab

Every model is written by `veil-shard synth-model` (a real vocabulary, so the
prompts are real text; the LM head and router sharpened so that most steps
are not near-ties). The test rebuilds each file with the same arguments and
checks its SHA-256 before comparing, so a fixture can never be compared with
a different model. Per case: the file's digest, the prompt (llama.cpp's ids),
llama.cpp's greedy continuation with its top-1/top-2 gap per step, and,
teacher-forced over the prompt, llama.cpp's top-5 (id, logit) at every
position. CI does not run this; the JSON is committed.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from llama_cpp import Llama, __version__

# name, shape, dtype, vocabulary file, sharpen, layers (None: the shape's),
# and optionally True to write Llama 3.1-style rope_freqs
CASES = [
    ("qwen3moe-q8_0", "qwen3moe-smoke", "q8_0", "ggml-vocab-qwen2.gguf", 24.0, None),
    ("qwen3moe-q4_k", "qwen3moe-smoke", "q4_k", "ggml-vocab-qwen2.gguf", 24.0, None),
    ("mixtral-q4_0", "mixtral-smoke", "q4_0", "ggml-vocab-llama-bpe.gguf", 24.0, None),
    ("mixtral-q6_k", "mixtral-smoke", "q6_k", "ggml-vocab-llama-bpe.gguf", 24.0, None),
    ("llama-q5_k", "smoke", "q5_k", "ggml-vocab-llama-bpe.gguf", 24.0, None),
    ("llama-bf16", "smoke", "bf16", "ggml-vocab-llama-bpe.gguf", 24.0, None),
    # Llama 3.1's RoPE frequency factors (over a 16-position original context).
    ("llama31-rope-q8_0", "smoke", "q8_0", "ggml-vocab-llama-bpe.gguf", 24.0, None, True),
    # gpt-oss: experts MXFP4, other matrices Q8_0; window 32 < the prompt.
    ("gpt-oss-mxfp4", "gpt-oss-smoke", "mxfp4", "ggml-vocab-llama-bpe.gguf", 24.0, None),
    # Gemma 3: five sliding-window layers (window 32) and one global.
    ("gemma3-q8_0", "gemma3-smoke", "q8_0", "ggml-vocab-llama-spm.gguf", 24.0, None),
]
SEED = 7
N_GEN = 32
PROMPT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, oil-based ink and a wooden press adapted from wine making. Within fifty years, "
    "presses were at work in more than two hundred European cities, and the price of books fell sharply. "
    "Literacy spread, scholars could compare identical copies, and errors no longer multiplied with each copy."
)


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def run_case(shard: str, vocab_dir: str, tmp: str, case) -> dict:
    name, shape, dtype, vocab, sharpen, layers = case[:6]
    rope_freqs = len(case) > 6 and case[6]
    path = os.path.join(tmp, f"{name}.gguf")
    args = [shard, "synth-model", "--shape", shape, "--dtype", dtype, "--vocab", os.path.join(vocab_dir, vocab),
            "--sharpen", str(sharpen), "--seed", str(SEED), "--out", path]
    if layers:
        args += ["--layers", str(layers)]
    if rope_freqs:
        args += ["--rope-freqs"]
    subprocess.run(args, check=True)
    llm = Llama(model_path=path, n_ctx=1024, n_batch=1024, n_threads=2, logits_all=True, verbose=False, seed=0)
    ids = llm.tokenize(PROMPT.encode(), add_bos=False, special=False)
    llm.reset()
    llm.eval(ids)
    forced = []
    for pos in range(len(ids)):
        logits = np.array(llm.scores[pos], dtype=np.float32)
        order = np.argsort(-logits, kind="stable")[:5]
        forced.append([[int(i), float(logits[i])] for i in order])
    gen, gaps = [], []
    for _ in range(N_GEN):
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        order = np.argsort(-logits, kind="stable")
        nxt = int(order[0])
        gen.append(nxt)
        gaps.append(float(logits[order[0]] - logits[order[1]]))
        llm.eval([nxt])
    del llm
    return {
        "name": name,
        "shape": shape,
        "dtype": dtype,
        "vocab": vocab,
        "sharpen": sharpen,
        "seed": SEED,
        "layers": layers,
        **({"rope_freqs": True} if rope_freqs else {}),
        "sha256": sha256(path),
        "prompt_ids": ids,
        "forced_top5": forced,
        "greedy_ids": gen,
        "top2_gaps": gaps,
    }


def main(shard: str, vocab_dir: str, out: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cases = [run_case(shard, vocab_dir, tmp, c) for c in CASES]
    doc = {
        "generator": f"llama-cpp-python {__version__}, scripts/reference/gen_family_fixtures.py",
        "cases": cases,
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    for c in cases:
        near = sum(g < 0.5 for g in c["top2_gaps"])
        print(f"{c['name']:16} prompt {len(c['prompt_ids'])} ids, greedy {len(c['greedy_ids'])}, near-ties {near}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "enclave/testdata/family_fixtures.json")
