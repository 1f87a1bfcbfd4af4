#!/usr/bin/env python3
"""Regenerates enclave/testdata/llamacpp_fixtures.json with llama.cpp.

Needs llama-cpp-python (PyPI; builds llama.cpp from source, slow on 2 cores):
    pip install llama-cpp-python==0.3.36
    python3 scripts/reference/gen_fixtures.py "$(scripts/fetch-model.sh)"

For every prompt: the prompt token ids, llama.cpp's greedy continuation
(up to 64 ids, stopping at EOS), the top-1/top-2 logit gap at every generated
position (to tell near-ties), and the top-5 logits at the first generated
position. CI does not run this; the JSON is committed.
"""
import json
import sys

import jinja2
import numpy as np
from llama_cpp import Llama, __version__

PLAIN = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village",
    "In 1969, Apollo 11 landed 2 astronauts on the Moon, 384,400 km from Earth.",
]
CHAT = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers greater than 10.",
]
N_GEN = 64


def main(model_path: str, out: str) -> None:
    llm = Llama(model_path=model_path, n_ctx=1024, n_batch=1024, n_threads=2, logits_all=True, verbose=False, seed=0)
    template = llm.metadata["tokenizer.chat_template"]
    eos = llm.token_eos()
    env = jinja2.Environment()
    cases = []
    for kind, prompt in [("plain", p) for p in PLAIN] + [("chat", p) for p in CHAT]:
        if kind == "chat":
            text = env.from_string(template).render(
                messages=[{"role": "user", "content": prompt}], add_generation_prompt=True
            )
        else:
            text = prompt
        ids = llm.tokenize(text.encode(), add_bos=False, special=(kind == "chat"))
        llm.reset()
        llm.eval(ids)
        gen, gaps, top5 = [], [], None
        for step in range(N_GEN):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            order = np.argsort(-logits, kind="stable")
            if step == 0:
                top5 = [[int(i), float(logits[i])] for i in order[:5]]
            nxt = int(order[0])
            gen.append(nxt)
            gaps.append(float(logits[order[0]] - logits[order[1]]))
            if nxt == eos:
                break
            llm.eval([nxt])
        cases.append({
            "kind": kind,
            "prompt": prompt,
            "text": text,
            "prompt_ids": [int(i) for i in ids],
            "greedy_ids": gen,
            "top2_gaps": gaps,
            "first_top5": top5,
        })
    doc = {
        "generator": f"llama-cpp-python {__version__}",
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "model_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "settings": "greedy argmax, n_ctx 1024, default KV type, no BOS (the GGUF says add_bos_token = false)",
        "cases": cases,
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "enclave/testdata/llamacpp_fixtures.json")
