#!/usr/bin/env python3
"""The reference model (SmolLM2-135M-Instruct, Q4_1) requantized by llama.cpp's
own quantizer (llama-cpp-python's `llama_model_quantize`, `allow_requantize`)
into every type it makes without an importance matrix, as people download
them: `<cache>/quants/SmolLM2-135M-Instruct.<TYPE>.gguf`. Prints one line per
file: `TYPE PATH SHA256`.

  scripts/make-real-quants.py --model SmolLM2-135M-Instruct.Q4_1.gguf [--out DIR] [TYPE...]

Needs llama-cpp-python (any build: quantizing is the same on every CPU).
Files that exist are kept (delete them to requantize).
"""
import argparse
import ctypes
import hashlib
import os
import sys

# llama.cpp's file types (`llama_ftype`) that need no importance matrix.
FTYPES = {
    "F16": 1,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q8_0": 7,
    "Q5_0": 8,
    "Q5_1": 9,
    "Q2_K": 10,
    "Q3_K_S": 11,
    "Q3_K_M": 12,
    "Q3_K_L": 13,
    "Q4_K_S": 14,
    "Q4_K_M": 15,
    "Q5_K_S": 16,
    "Q5_K_M": 17,
    "Q6_K": 18,
    "IQ4_NL": 25,
    "IQ3_S": 26,
    "IQ3_M": 27,
    "IQ4_XS": 30,
    "BF16": 32,
    "TQ1_0": 36,
    "TQ2_0": 37,
}


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default=os.path.join(os.path.expanduser("~/.cache/veil/models"), "quants"))
    ap.add_argument("types", nargs="*", default=list(FTYPES))
    args = ap.parse_args()

    import llama_cpp

    os.makedirs(args.out, exist_ok=True)
    stem = os.path.basename(args.model).split(".")[0]
    for name in args.types:
        if name not in FTYPES:
            print(f"unknown type {name}; known: {' '.join(FTYPES)}", file=sys.stderr)
            return 2
        dst = os.path.join(args.out, f"{stem}.{name}.gguf")
        if not os.path.exists(dst):
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = FTYPES[name]
            params.allow_requantize = True
            params.nthread = os.cpu_count() or 1
            tmp = dst + ".part"
            rc = llama_cpp.llama_model_quantize(args.model.encode(), tmp.encode(), ctypes.byref(params))
            if rc != 0:
                print(f"{name}: llama_model_quantize returned {rc}", file=sys.stderr)
                return 1
            os.replace(tmp, dst)
        print(f"{name} {dst} {sha256(dst)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
