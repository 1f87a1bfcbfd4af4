#!/usr/bin/env python3
"""Files in the types llama.cpp's quantiser writes only with an importance
matrix (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S; also IQ3_XXS and Q2_K), and
the ternary types (TQ1_0, TQ2_0: a model not trained ternary, quantised to
them, overflows in any engine; random blocks at a damped scale do not), made
from a real model without one: every matrix whose rows are a whole number of
256-value blocks (the reference model's `ffn_down`s) becomes random but valid
blocks of the type, its scales set so the dequantised matrix has a twentieth
of the original's standard deviation (`--std-scale`: at the original's, the
random matrices drive the model into overflow-sized logits on which any
two engines disagree); every other tensor is kept as it is. Any valid
block runs in llama.cpp, so Veil and llama.cpp can be compared on the same
file (`scripts/compare-quants.sh`: KL divergence and top-1 agreement; the
perplexity of such a model means nothing). Prints one line per file:
`TYPE PATH SHA256`.

  scripts/make-random-iquants.py --model F16.gguf [--out DIR] [--seed N] [--std-scale X] [--embedding-q8-0] [TYPE...]

`--embedding-q8-0` stores the token embedding as Q8_0 (gguf-py's quantiser)
instead of as it was: for speed benchmarks, where an F16 embedding that is
also the output head would cost more than every layer of a small model.

Needs the `gguf` package (gguf-py). The model should be F16 or F32 (other
tensors are copied as stored).
"""
import argparse
import hashlib
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

TYPES = ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "Q2_K", "TQ1_0", "TQ2_0"]


def f16_bits(x):
    return np.array([x], dtype=np.float16).view(np.uint16)[0]


def set_scale(blocks, qtype, d):
    """Writes scale `d` (f16) into every block (`blocks`: n × block bytes, uint8)."""
    bits = int(f16_bits(d))
    if qtype == Q.Q2_K:
        # d at 80, dmin at 82 (the mins' scale: a tenth of d keeps values centred).
        blocks[:, 80:82] = np.frombuffer(np.uint16(bits).tobytes(), np.uint8)
        blocks[:, 82:84] = np.frombuffer(np.uint16(int(f16_bits(d / 10))).tobytes(), np.uint8)
    elif qtype == Q.IQ1_M:
        # The f16 scale is split over the top nibbles of the four u16 scales at 48..56.
        s = blocks[:, 48:56].copy().view(np.uint16)
        for k in range(4):
            s[:, k] = (s[:, k] & 0x0FFF) | (((bits >> (4 * k)) & 0xF) << 12)
        blocks[:, 48:56] = s.view(np.uint8)
    elif qtype in (Q.TQ1_0, Q.TQ2_0):
        # `d: f16` last (TQ1_0 at 52, TQ2_0 at 64).
        at = 52 if qtype == Q.TQ1_0 else 64
        blocks[:, at:at + 2] = np.frombuffer(np.uint16(bits).tobytes(), np.uint8)
    else:
        # IQ1_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS: `d: f16` first.
        blocks[:, 0:2] = np.frombuffer(np.uint16(bits).tobytes(), np.uint8)


def random_tensor(rng, qtype, shape, target_std):
    values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    n = int(np.prod(shape)) // values
    blocks = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
    set_scale(blocks, qtype, 1.0)
    std1 = float(np.std(gguf.quants.dequantize(blocks.reshape(-1), qtype)))
    set_scale(blocks, qtype, target_std / std1)
    out = gguf.quants.dequantize(blocks.reshape(-1), qtype)
    assert np.all(np.isfinite(out)), qtype.name
    return blocks.reshape(shape[0], -1)


def copy_fields(reader, writer):
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)


def make(model, out, qtype, seed, std_scale, embedding_q8_0=False):
    reader = gguf.GGUFReader(model)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(out, arch)
    copy_fields(reader, writer)
    rng = np.random.default_rng(seed)
    changed = 0
    for t in reader.tensors:
        shape = [int(x) for x in reversed(t.shape)]  # rows, then row length
        is_matrix = len(shape) == 2 and t.name != "token_embd.weight"
        if is_matrix and shape[-1] % 256 == 0 and t.tensor_type in (Q.F16, Q.F32, Q.BF16):
            std = float(np.std(gguf.quants.dequantize(t.data, t.tensor_type)))
            data = random_tensor(rng, qtype, shape, std * std_scale)
            writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=qtype)
            changed += 1
        elif t.name == "token_embd.weight" and embedding_q8_0 and t.tensor_type in (Q.F16, Q.F32, Q.BF16):
            values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
            data = gguf.quants.quantize(values.astype(np.float32), Q.Q8_0)
            writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=Q.Q8_0)
        else:
            writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    if changed == 0:
        sys.exit(f"{model}: no matrix has rows of whole 256-value blocks")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return changed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default=os.path.expanduser("~/.cache/veil/models/quants"))
    ap.add_argument("--seed", type=int, default=54)
    ap.add_argument("--std-scale", type=float, default=0.05)
    ap.add_argument("--embedding-q8-0", action="store_true")
    ap.add_argument("types", nargs="*", default=TYPES)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.basename(args.model).rsplit(".", 2)[0]
    for name in args.types:
        qtype = Q[name]
        tag = "-embd-q8_0" if args.embedding_q8_0 else ""
        path = os.path.join(args.out, f"{stem}.random-{name}{tag}.gguf")
        if not os.path.exists(path):
            make(args.model, path, qtype, args.seed, args.std_scale, args.embedding_q8_0)
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
        print(name, path, digest)


if __name__ == "__main__":
    main()
