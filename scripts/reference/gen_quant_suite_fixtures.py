#!/usr/bin/env python3
"""Regenerates enclave/testdata/quant_suite/llamacpp.json: llama.cpp's answers
on the reference model's real weights in every ggml type (the files
`scripts/fetch-quant-suite.sh` makes).

Per type: the file's SHA-256 (the test refuses to compare another file),
llama.cpp's perplexity over `enclave/testdata/perplexity/prose.txt` by
`scripts/perplexity-llamacpp.py`'s method (windows of 512, two of them), and
for two prompts (one plain, one in the chat template) llama.cpp's greedy
continuation of up to 64 tokens with its top-1/top-2 logit gap at every step
(to tell near-ties). Each scored token's log-probability, and llama.cpp's
own noise floor: the same perplexity run by a second build of llama.cpp
(for AVX only, installed with `pip install --target DIR`), its perplexity
and the mean absolute difference of its per-token log-probabilities from
the native build's.

    pip install llama-cpp-python==0.3.36   # CMAKE_ARGS="-DGGML_NATIVE=ON"
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=ON -DGGML_BMI2=OFF" \
        pip install --no-binary :all: --target AVX_DIR llama-cpp-python==0.3.36
    python3 scripts/reference/gen_quant_suite_fixtures.py --floor-build AVX_DIR \
        "$(scripts/fetch-quant-suite.sh "$(scripts/fetch-model.sh)")"

CI does not run this; the JSON is committed.
"""
import argparse
import hashlib
import json
import os
import subprocess
import tempfile
import sys
from pathlib import Path

import jinja2
import numpy as np
from llama_cpp import Llama, __version__

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from importlib.util import module_from_spec, spec_from_file_location  # noqa: E402

_spec = spec_from_file_location("make_quant_suite", ROOT / "scripts/make-quant-suite.py")
suite = module_from_spec(_spec)
_spec.loader.exec_module(suite)

PROMPTS = [("plain", "The capital of France is"), ("chat", "Write a haiku about the sea.")]
N_GEN = 64
CTX, CHUNKS = 512, 2


def greedy(llm: Llama, kind: str, prompt: str) -> dict:
    if kind == "chat":
        text = jinja2.Environment().from_string(llm.metadata["tokenizer.chat_template"]).render(
            messages=[{"role": "user", "content": prompt}], add_generation_prompt=True
        )
    else:
        text = prompt
    ids = llm.tokenize(text.encode(), add_bos=False, special=(kind == "chat"))
    llm.reset()
    llm.eval(ids)
    gen, gaps = [], []
    for _ in range(N_GEN):
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        order = np.argsort(-logits, kind="stable")
        nxt = int(order[0])
        gen.append(nxt)
        gaps.append(round(float(logits[order[0]] - logits[order[1]]), 4))
        if nxt == llm.token_eos():
            break
        llm.eval([nxt])
    return {"kind": kind, "prompt": prompt, "prompt_ids": [int(i) for i in ids], "greedy_ids": gen, "top2_gaps": gaps}


def perplexity(path: Path, pythonpath: str | None = None) -> tuple[float, list[float]]:
    """llama.cpp's perplexity of `path` and each scored token's log-probability
    (with `pythonpath`: by the llama-cpp-python build installed there)."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    with tempfile.NamedTemporaryFile(suffix=".txt") as scores:
        out = subprocess.run(
            [sys.executable, str(ROOT / "scripts/perplexity-llamacpp.py"), "--model", str(path),
             "--file", str(ROOT / "enclave/testdata/perplexity/prose.txt"), "--ctx", str(CTX), "--chunks", str(CHUNKS),
             "--save-scores", scores.name],
            check=True, capture_output=True, text=True, env=env,
        ).stdout
        lps = [float(v) for v in Path(scores.name).read_text().split()]
    return float(next(line for line in out.splitlines() if line.startswith("perplexity: ")).split()[1]), lps


def main(directory: str, out: str, floor_build: str | None) -> None:
    cases = []
    for name in suite.TYPES:
        path = next(Path(directory).glob(f"*.suite-{name}.gguf"))
        llm = Llama(model_path=str(path), n_ctx=1024, n_batch=1024, n_threads=2, logits_all=True, verbose=False)
        ppl, lps = perplexity(path)
        case = {
            "type": name,
            "file": path.name,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "perplexity": ppl,
            "token_logprobs": [round(v, 5) for v in lps],
            "greedy": [greedy(llm, kind, prompt) for kind, prompt in PROMPTS],
        }
        if floor_build:
            floor_ppl, floor_lps = perplexity(path, floor_build)
            case["noise_floor"] = {
                "perplexity": floor_ppl,
                "mean_abs_logprob_diff": round(float(np.mean(np.abs(np.array(floor_lps) - np.array(lps)))), 6),
            }
        cases.append(case)
        del llm
        print(f"{name}: perplexity {cases[-1]['perplexity']}", file=sys.stderr)
    doc = {
        "noise_floor": "the same perplexity run by a second llama.cpp build, llama-cpp-python 0.3.36 built for AVX "
        "without AVX2, FMA or BMI2 (CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=OFF -DGGML_FMA=OFF "
        "-DGGML_F16C=ON -DGGML_BMI2=OFF\"): its perplexity, and the mean absolute difference of its per-token "
        "log-probabilities from the native build's",
        "generator": f"llama-cpp-python {__version__} (built with -DGGML_NATIVE=ON)",
        "files": "scripts/fetch-quant-suite.sh on SmolLM2-135M-Instruct.Q4_1.gguf",
        "perplexity": f"prose.txt, windows of {CTX}, {CHUNKS} windows (scripts/perplexity-llamacpp.py)",
        "greedy": f"argmax, up to {N_GEN} tokens, stopping at EOS; n_ctx 1024, no BOS",
        "cases": cases,
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory", help="the files (scripts/fetch-quant-suite.sh prints it)")
    ap.add_argument("--out", default=str(ROOT / "enclave/testdata/quant_suite/llamacpp.json"))
    ap.add_argument("--floor-build", required=True, help="PYTHONPATH of the second (AVX) llama-cpp-python build")
    args = ap.parse_args()
    main(args.directory, args.out, args.floor_build)
