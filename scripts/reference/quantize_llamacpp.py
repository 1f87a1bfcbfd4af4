#!/usr/bin/env python3
"""Quantizes a GGUF with llama.cpp's own quantizer (llama-cpp-python's
`llama_model_quantize`), so benchmark models carry llama.cpp's type mix
(a Q4_K_M file: Q4_K, with Q6_K for some attention-value and feed-forward
down matrices and for the output).

    python3 scripts/reference/quantize_llamacpp.py IN.gguf OUT.gguf TYPE [THREADS]

TYPE: q8_0, q6_k, q5_k_m, q5_0, q5_1, q4_k_m, q3_k_m, q2_k, iq4_xs or iq4_nl (the types
llama.cpp writes without an importance matrix that the benchmarks use).
"""
import ctypes
import sys

import llama_cpp

FTYPES = {
    "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
    "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "q5_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M,
    "q6_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K,
    "q5_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_0,
    "q5_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_1,
    "q3_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_M,
    "q2_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K,
    "iq4_xs": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_XS,
    "iq4_nl": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_NL,
}


def main() -> int:
    if len(sys.argv) not in (4, 5) or sys.argv[3] not in FTYPES:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[sys.argv[3]]
    params.nthread = int(sys.argv[4]) if len(sys.argv) == 5 else 0
    return llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(params))


if __name__ == "__main__":
    sys.exit(main())
