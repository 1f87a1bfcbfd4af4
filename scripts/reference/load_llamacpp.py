#!/usr/bin/env python3
"""Loads a whole GGUF (the first file of a split one) with llama.cpp
(llama-cpp-python), as the stage-load benchmark's reference, and prints one
JSON object: wall time of the load and peak RSS, with llama.cpp's default
memory-mapped load or with mmap off (weights read into its own memory).

    python3 scripts/reference/load_llamacpp.py MODEL.gguf mmap|read
"""
import json
import resource
import sys
import time

from llama_cpp import Llama


def main(model: str, mode: str) -> None:
    t = time.perf_counter()
    llm = Llama(model_path=model, n_ctx=512, n_threads=2, use_mmap=(mode == "mmap"), verbose=False)
    load_s = time.perf_counter() - t
    # One token, so a memory-mapped model has touched what a first step needs.
    llm.eval(llm.tokenize(b"Hello", add_bos=False)[:1])
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"engine": "llama.cpp", "mode": mode, "load_seconds": load_s, "peak_rss": peak_kib * 1024}))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in ("mmap", "read"):
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1], sys.argv[2])
