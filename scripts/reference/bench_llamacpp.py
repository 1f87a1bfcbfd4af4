#!/usr/bin/env python3
"""Times llama.cpp (llama-cpp-python) on a GGUF: prefill of 128 and 512
tokens and decode of 128 tokens, with the given thread count. Prints one JSON
object. The Veil model bench runs this in the same run, as its reference.

    python3 scripts/reference/bench_llamacpp.py MODEL.gguf THREADS
"""
import json
import sys
import time

from llama_cpp import Llama


def main(model: str, threads: int) -> None:
    llm = Llama(model_path=model, n_ctx=1024, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False)
    base = llm.tokenize(b"The history of the printing press begins in the fifteenth century, when ", add_bos=False)
    prompt = (base * 64)[:512]
    out = {"engine": "llama.cpp (llama-cpp-python)", "threads": threads}
    for n in (128, 512):
        best = float("inf")
        for _ in range(3):
            llm.reset()
            t = time.perf_counter()
            llm.eval(prompt[:n])
            best = min(best, time.perf_counter() - t)
        out[f"prefill_{n}_tok_s"] = n / best
    llm.reset()
    llm.eval(prompt[:16])
    t = time.perf_counter()
    # Decode cost is independent of which token is fed; feed the prompt on.
    for i in range(128):
        llm.eval([prompt[16 + i]])
    out["decode_128_tok_s"] = 128 / (time.perf_counter() - t)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
