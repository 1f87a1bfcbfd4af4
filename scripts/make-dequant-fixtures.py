#!/usr/bin/env python3
"""Write enclave/testdata/dequant/: for each ggml type Veil dequantizes, a
few random but valid blocks (`<TYPE>.bin`) and their values as gguf-py's
`gguf.quants.dequantize` computes them (`<TYPE>.f32`, little-endian f32).
`model::quant::dequant`'s tests compare every value's bits with these.

Blocks are random bytes (seeded, so the files are reproducible) with the
scale fields set to finite values of mixed sign and magnitude, subnormal
ones included; the other bytes stay random, which exercises every
quant/grid/sign bit. Three types have no gguf-py dequantizer, so their
values come from numpy transliterations of ggml's C below, marked as such:
Q8_K (`dequantize_row_q8_K`), Q1_0 (`dequantize_row_q1_0`), and F64
(ggml has none; numpy's `astype(float32)`, round to nearest even).

Usage (from the repository root):
    python3 scripts/make-dequant-fixtures.py
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import numpy as np

import gguf.quants as gq
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

OUT = Path(__file__).resolve().parent.parent / "enclave/testdata/dequant"

# Blocks per fixture: enough for every layout path, small enough to commit.
BLOCKS = {256: 3, 128: 4, 64: 6, 32: 8, 1: 256}

# Where each type keeps its f16 scales (byte offsets in a block).
F16_SCALES = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0], T.IQ3_XXS: [0], T.IQ3_S: [0],
    T.IQ1_S: [0], T.IQ4_NL: [0], T.IQ4_XS: [0], T.TQ1_0: [52], T.TQ2_0: [64],
    T.Q1_0: [0],
}


def scales(rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` finite f16 scales, mixed sign, magnitudes 2^-20 (subnormal) to 2^4."""
    mag = 2.0 ** rng.uniform(-20, 4, size=n)
    sign = np.where(rng.random(n) < 0.25, -1.0, 1.0)
    s = (mag * sign).astype(np.float16)
    assert np.all(np.isfinite(s))
    return s


def blocks_for(ty: T, rng: np.random.Generator) -> np.ndarray:
    values, size = GGML_QUANT_SIZES[ty]
    n = BLOCKS[values]
    b = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    for at in F16_SCALES.get(ty, []):
        b[:, at:at + 2] = scales(rng, n).view(np.uint8).reshape(n, 2)
    if ty == T.IQ1_M:
        # The f16 scale's four nibbles are the top nibbles of the four u16
        # at bytes 48..56 (lowest nibble first).
        d = scales(rng, n).view(np.uint16)
        sc = b[:, 48:56].copy().view(np.uint16)
        for k in range(4):
            sc[:, k] = (sc[:, k] & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12)
        b[:, 48:56] = sc.view(np.uint8)
    elif ty == T.Q8_K:
        d = (2.0 ** rng.uniform(-30, 0, size=n) * np.where(rng.random(n) < 0.25, -1, 1)).astype(np.float32)
        b[:, 0:4] = d.view(np.uint8).reshape(n, 4)
    elif ty == T.MXFP4:
        # E8M0 is finite at every byte; include both subnormal scales and
        # the largest (whose big values overflow to inf, as in ggml).
        b[:4, 0] = [0, 1, 127, 255]
    elif ty == T.NVFP4:
        # UE4M3: zero, the NaN code (read as 0), a subnormal, the largest.
        b[0, 0:4] = [0x00, 0x7F, 0x01, 0x7E]
        b[1, 0:4] = [0x38, 0xFF, 0x80, 0x08]
    elif ty == T.F16:
        h = b.view(np.uint16).reshape(-1)
        # No signalling NaNs (how they widen differs between hardware and
        # numpy's software path); quiet NaNs and every other code stay.
        snan = ((h & 0x7C00) == 0x7C00) & ((h & 0x03FF) != 0) & ((h & 0x0200) == 0)
        h[snan] |= 0x0200
        h[:8] = [0x0000, 0x8000, 0x7C00, 0xFC00, 0x0001, 0x83FF, 0x7BFF, 0x7E01]
    elif ty == T.BF16:
        h = b.view(np.uint16).reshape(-1)
        h[:6] = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7F81, 0x0001]
    elif ty == T.F32:
        w = b.view(np.uint32).reshape(-1)
        w[:6] = [0x00000000, 0x80000000, 0x7F800000, 0x7F800001, 0x00000001, 0xFFC12345]
    elif ty == T.F64:
        x = rng.standard_normal(n) * 2.0 ** rng.uniform(-160, 160, size=n)
        # Ties and edges: halfway between two f32s (to even), overflow, the
        # smallest subnormal and below it, signed zero.
        x[:8] = [1 + 2.0**-24, 1 + 3 * 2.0**-24, 3.5e38, -1e39, 2.0**-149, 2.0**-151, -0.0, np.inf]
        b = x.astype("<f8").view(np.uint8).reshape(n, 8)
    return b


def reference(ty: T, b: np.ndarray) -> tuple[np.ndarray, str]:
    """gguf-py's values for `b`, or a numpy port of ggml's where it has none."""
    n = b.shape[0]
    if ty == T.Q8_K:
        # ggml: y[j] = x.d * x.qs[j]
        d = b[:, 0:4].copy().view("<f4").astype(np.float32)
        qs = b[:, 4:260].view(np.int8).astype(np.float32)
        return (d * qs).reshape(-1), "numpy port of ggml's dequantize_row_q8_K"
    if ty == T.Q1_0:
        # ggml: y[j] = bit j of qs ? d : -d
        d = b[:, 0:2].copy().view("<f2").astype(np.float32)
        bits = np.unpackbits(b[:, 2:18], axis=-1, bitorder="little")
        return np.where(bits == 1, d, -d).astype(np.float32).reshape(-1), "numpy port of ggml's dequantize_row_q1_0"
    if ty == T.F64:
        return b.copy().view("<f8").astype(np.float32).reshape(-1), "numpy astype(float32)"
    out = gq.dequantize(b.reshape(1, -1), ty)
    assert out.dtype == np.float32
    return np.asarray(out).reshape(-1), "gguf.quants.dequantize"


TYPES = [
    T.F32, T.F16, T.BF16, T.F64,
    T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
    T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_K,
    T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M,
    T.IQ4_NL, T.IQ4_XS, T.TQ1_0, T.TQ2_0, T.MXFP4, T.NVFP4, T.Q1_0,
]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    total = 0
    for ty in TYPES:
        rng = np.random.default_rng(54_000 + int(ty))  # issue 54, per type
        b = blocks_for(ty, rng)
        with np.errstate(over="ignore"):  # MXFP4's and F64's overflow to inf on purpose
            values, source = reference(ty, b)
        assert values.size == b.shape[0] * GGML_QUANT_SIZES[ty][0]
        (OUT / f"{ty.name}.bin").write_bytes(b.tobytes())
        (OUT / f"{ty.name}.f32").write_bytes(values.astype("<f4").tobytes())
        total += b.nbytes + values.size * 4
        rows.append(f"| {ty.name} | {b.shape[0]} | {values.size} | {source} |")

    readme = f"""# Dequantization vectors

For each ggml type that `model::quant::dequant` decodes: `<TYPE>.bin`, a few
whole blocks of that type, and `<TYPE>.f32`, their values (little-endian
f32, in order). The test `quant::dequant::tests::matches_gguf_py_bit_for_bit_on_every_supported_type`
compares every value's bits.

Provenance: made by `scripts/make-dequant-fixtures.py` with gguf-py
{version('gguf')} (PyPI `gguf`) and numpy {np.__version__}. Blocks are seeded
random bytes (seed 54000 + the ggml type id) with the scale fields set to
finite values of mixed sign and magnitude (subnormal included); special
codes are placed on purpose (F16/BF16/F32 zeros, infinities, NaNs;
MXFP4 E8M0 0, 1, 255; NVFP4 UE4M3 0x00, 0x7f, 0xff). F16 has no signalling
NaNs (their widening differs between hardware and numpy's software path).

Expected values are gguf-py's `gguf.quants.dequantize`, except where it has
no dequantizer: Q8_K and Q1_0 (numpy ports of ggml's `dequantize_row_q8_K`
and `dequantize_row_q1_0`, in the script) and F64 (ggml has no to-float for
it; numpy's `astype(float32)`).

Regenerate (from the repository root):

    python3 scripts/make-dequant-fixtures.py

| type | blocks | values | expected values from |
|---|---|---|---|
""" + "\n".join(rows) + "\n"
    (OUT / "README.md").write_text(readme)
    print(f"wrote {len(TYPES)} types, {total} bytes, to {OUT}")


if __name__ == "__main__":
    main()
