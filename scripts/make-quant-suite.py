#!/usr/bin/env python3
"""The reference model's real weights in every ggml type, quantised by ggml's
own quantiser: `<out>/SmolLM2-135M-Instruct.suite-<TYPE>.gguf`, one file per
type. Prints one line per file: `TYPE SHA256 PATH`.

  scripts/make-quant-suite.py --ggml libggml-base.so --model SmolLM2-135M-Instruct.Q4_1.gguf --out DIR [TYPE...]
  scripts/make-quant-suite.py --ggml ... --model OTHER.gguf --embedding Q8_0 --out DIR TYPE

The second form makes a benchmark file from any GGUF (a random-weight one
from `veil-shard synth-model --dtype f16`), with the token embedding and
the output head quantised too, so neither is left in F16.

Each file is the reference file with every transformer matrix (`blk.*`,
2-D) dequantised (gguf-py) and quantised again to TYPE by
`ggml_quantize_chunk`, the function llama.cpp's `llama-quantize` calls, where
a row holds whole blocks of TYPE. Rows of 576 values (every matrix but
`ffn_down`) hold no whole 256-value block, so for the K, IQ (but IQ4_NL) and
ternary types those matrices are Q8_0, as close to the original as a file
gets, and only the 30 `ffn_down`s are TYPE; llama.cpp's own "Q4_K_M" of
this model falls back in the same place (to Q5_0). The token embedding and
the norms are kept as they are. The types that llama.cpp's quantiser makes
only with an importance matrix (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S) get a
uniform one (every weight 1), which is a valid importance matrix.

The metadata bytes are copied unchanged; the output is a function of the
input file, ggml's source and gguf-py's dequantiser only, so the SHA-256s
printed here are those in `enclave/testdata/quant_suite/llamacpp.json`.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import multiprocessing
import os
import struct
import sys
from pathlib import Path

import numpy as np

import gguf
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

# Every type llama.cpp's quantiser writes (ggml's list), F32 aside (no model
# ships its matrices in F32; the norms are F32 in every file).
TYPES = [
    "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS",
    "TQ1_0", "TQ2_0", "MXFP4", "NVFP4",
]
NEEDS_IMATRIX = {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S"}
FALLBACK = T.Q8_0
ALIGNMENT = 32
# The matrices `--embedding` quantises.
HEAD = {"token_embd.weight", "output.weight"}


def load_ggml(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
        ctypes.c_void_p,
    ]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.ggml_type_name.restype = ctypes.c_char_p
    lib.ggml_type_name.argtypes = [ctypes.c_int]
    lib.ggml_quantize_free.restype = None
    return lib


def quantize(lib: ctypes.CDLL, qtype: T, values: np.ndarray, imatrix: bool) -> bytes:
    """`values` (rows × n_per_row, f32) in `qtype`, as ggml quantises them."""
    rows, n_per_row = values.shape
    src = np.ascontiguousarray(values, dtype=np.float32)
    dst = np.zeros(rows * lib.ggml_row_size(int(qtype), n_per_row), dtype=np.uint8)
    weights = np.ones(n_per_row, dtype=np.float32) if imatrix else None
    written = lib.ggml_quantize_chunk(
        int(qtype), src.ctypes.data, dst.ctypes.data, 0, rows, n_per_row,
        weights.ctypes.data if weights is not None else None,
    )
    if written != dst.nbytes:
        raise SystemExit(f"ggml wrote {written} bytes for {rows}x{n_per_row} {qtype.name}, expected {dst.nbytes}")
    return dst.tobytes()


def kv_section(reader: gguf.GGUFReader) -> tuple[bytes, int, int]:
    """The source file's metadata key-value bytes, verbatim, and its counts."""
    raw = reader.data
    start = 4 + 4 + 8 + 8
    end = start
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        end = max(end, field.offset + sum(int(p.nbytes) for p in field.parts))
    version = int(reader.fields["GGUF.version"].parts[-1][0])
    kv_count = int(reader.fields["GGUF.kv_count"].parts[-1][0])
    if "general.alignment" in reader.fields:
        raise SystemExit("the source sets general.alignment; this script writes 32-byte alignment only")
    return bytes(raw[start:end]), version, kv_count


# Set before the workers fork: the source file and its matrices in f32.
SOURCE: dict = {}


def write_suite_file(lib: ctypes.CDLL, qtype: T, path: Path) -> None:
    reader, matrices = SOURCE["reader"], SOURCE["matrices"]
    kv, version, kv_count = kv_section(reader)
    infos, blobs = [], []
    offset = 0
    for t in reader.tensors:
        dims = [int(d) for d in t.shape]
        if t.name in HEAD and SOURCE.get("embedding") is not None:
            data = quantize(lib, SOURCE["embedding"], matrices[t.name], False)
            target = SOURCE["embedding"]
        elif t.name.startswith("blk.") and len(dims) == 2:
            n_per_row, rows = dims
            block = GGML_QUANT_SIZES[qtype][0]
            target = qtype if n_per_row % block == 0 else FALLBACK
            data = quantize(lib, target, matrices[t.name], qtype.name in NEEDS_IMATRIX)
        else:
            target = t.tensor_type
            data = bytes(t.data.tobytes())
        infos.append((t.name, dims, int(target), offset))
        blobs.append(data)
        offset += len(data)
        offset += -offset % ALIGNMENT
    out = bytearray()
    out += struct.pack("<4sIQQ", b"GGUF", version, len(infos), kv_count)
    out += kv
    for name, dims, ty, off in infos:
        encoded = name.encode()
        out += struct.pack("<Q", len(encoded)) + encoded
        out += struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ty, off)
    out += b"\0" * (-len(out) % ALIGNMENT)
    for data in blobs:
        out += data
        out += b"\0" * (-len(out) % ALIGNMENT)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(out)
    os.replace(tmp, path)


def make_one(job: tuple[str, str, str]) -> str:
    """One type's file (a worker: loads its own copy of ggml)."""
    ggml, name, path = job
    lib = load_ggml(ggml)
    qtype = T[name]
    if lib.ggml_type_name(int(qtype)).decode().upper() != name:
        raise SystemExit(f"ggml's type {int(qtype)} is {lib.ggml_type_name(int(qtype))}, not {name}")
    if not Path(path).exists():
        write_suite_file(lib, qtype, Path(path))
    lib.ggml_quantize_free()
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ggml", required=True, help="ggml's base library (scripts/fetch-quant-suite.sh builds it)")
    ap.add_argument("--model", required=True, help="the reference GGUF")
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--embedding", choices=["Q8_0", "Q6_K", "Q4_K"], help="quantise the embedding and output head too")
    ap.add_argument("types", nargs="*", default=TYPES)
    args = ap.parse_args()
    if args.embedding:
        SOURCE["embedding"] = T[args.embedding]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = Path(args.model).name.split(".")[0]
    jobs = [(args.ggml, name, str(out / f"{stem}.suite-{name}.gguf")) for name in args.types]
    if any(not Path(path).exists() for _, _, path in jobs):
        reader = gguf.GGUFReader(args.model)
        SOURCE["reader"] = reader
        SOURCE["matrices"] = {
            t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(int(t.shape[1]), int(t.shape[0]))
            for t in reader.tensors
            if (t.name.startswith("blk.") and len(t.shape) == 2)
            or (args.embedding and t.name in HEAD)
        }
    # Each type's quantiser is single-threaded: one worker per core.
    with multiprocessing.get_context("fork").Pool(max(1, min(args.jobs, len(jobs)))) as pool:
        for (_, name, path), digest in zip(jobs, pool.imap(make_one, jobs)):
            print(f"{name} {digest} {path}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
