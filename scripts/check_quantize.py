#!/usr/bin/env python3
"""Cross-checks kiln-quantize's outputs with gguf-py (an implementation independent of kiln).

Needs the tooling venv (.venv: gguf, numpy; scripts/python_env.sh). Run by scripts/python_checks.sh:

    check_quantize.py [--tensors-only] ORIGINAL.gguf OUT.gguf [OUT.gguf ...]

For each output (its type read from general.file_type):
  * metadata: every field of the original is there with the same types and value, except
    general.file_type (llama.cpp's LLAMA_FTYPE of the type) and general.quantization_version (2);
  * tensors: same names and shapes; each quantized tensor's bytes equal gguf-py's own quantizer
    (gguf.quants.quantize) run on the original, and its dequantization (gguf.quants.dequantize) is
    within the type's error bound of the original, block by block (see bound()); every other tensor
    dequantizes to exactly the original values.
--tensors-only skips the metadata comparison (for an output converted from a safetensors checkpoint
holding ORIGINAL's weights: its metadata is convert_hf_to_gguf.py's, not ORIGINAL's).
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize, quantize

FTYPE = {7: Q.Q8_0, 2: Q.Q4_0, 3: Q.Q4_1, 8: Q.Q5_0, 9: Q.Q5_1}
F16_EPS = 2.0 ** -11  # relative rounding error of the f16 scale (and offset) stored in each block


def bound(x, qtype):
    """Largest |x - dequant(quant(x))| allowed per block of 32 values (x: (blocks, 32) float64).

    Q8_0: d = amax/127, half a step, plus the f16 rounding of d times |q| <= 127.
    Q4_0 / Q5_0: d = -max/8 (/16), q clipped to [0, 15] ([0, 31]) at one end: at most one step there,
      plus the f16 rounding of d times |q - 8| <= 8 (16).
    Q4_1 / Q5_1: d = (max - min)/15 (/31), half a step, plus the f16 rounding of d times q <= 15 (31)
      and of the offset min.
    """
    amax = np.abs(x).max(axis=1)
    lo, hi = x.min(axis=1), x.max(axis=1)
    if qtype == Q.Q8_0:
        d = amax / 127
        b = d * (0.5 + 127 * F16_EPS)
    elif qtype in (Q.Q4_0, Q.Q5_0):
        n = 8 if qtype == Q.Q4_0 else 16
        d = amax / n
        b = d * (1 + n * F16_EPS)
    else:
        n = 15 if qtype == Q.Q4_1 else 31
        d = (hi - lo) / n
        b = d * (0.5 + n * F16_EPS) + np.abs(lo) * F16_EPS
    return b + 1e-6 * amax + 1e-30


def field_value(f):
    return [np.asarray(f.parts[i]).tobytes() for i in f.data]


def check(orig, path, tensors_only):
    out = GGUFReader(path)
    ftype = int(out.fields["general.file_type"].contents())
    if ftype not in FTYPE:
        raise SystemExit(f"{path}: general.file_type {ftype} is not a quantized type this check knows")
    qtype = FTYPE[ftype]
    errors = []

    # Metadata round trip.
    for key, f in orig.fields.items():
        if tensors_only:
            break
        if key.startswith("GGUF.") or key in ("general.file_type", "general.quantization_version"):
            continue
        g = out.fields.get(key)
        if g is None:
            errors.append(f"metadata key {key} missing")
        elif g.types != f.types or field_value(g) != field_value(f):
            errors.append(f"metadata key {key} differs: {g.types} vs {f.types}")
    if int(out.fields["general.quantization_version"].contents()) != 2:
        errors.append("general.quantization_version is not 2")
    if out.fields["general.quantization_version"].types != [GGUFValueType.UINT32]:
        errors.append("general.quantization_version is not UINT32")

    # Tensors.
    otensors = {t.name: t for t in out.tensors}
    if sorted(otensors) != sorted(t.name for t in orig.tensors):
        errors.append("tensor names differ")
    n_quant = worst = 0
    for t in orig.tensors:
        o = otensors.get(t.name)
        if o is None:
            continue
        if list(o.shape) != list(t.shape):
            errors.append(f"{t.name}: shape {list(o.shape)} != {list(t.shape)}")
            continue
        x = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1, int(t.shape[0]))
        if o.tensor_type in FTYPE.values():
            n_quant += 1
            ref = quantize(x, o.tensor_type)
            if not np.array_equal(np.asarray(o.data).reshape(ref.shape), ref):
                errors.append(f"{t.name}: bytes differ from gguf-py's {o.tensor_type.name} quantizer")
            y = dequantize(o.data, o.tensor_type).reshape(x.shape)
            xb, yb = x.astype(np.float64).reshape(-1, 32), y.astype(np.float64).reshape(-1, 32)
            err = np.abs(xb - yb).max(axis=1)
            lim = bound(xb, o.tensor_type)
            worst = max(worst, float((err / lim).max()))
            if not np.all(err <= lim):
                i = int(np.argmax(err / lim))
                errors.append(f"{t.name}: block {i} error {err[i]:.3g} exceeds the {o.tensor_type.name} bound {lim[i]:.3g}")
        else:
            y = dequantize(o.data, o.tensor_type).astype(np.float32).reshape(x.shape)
            if not np.array_equal(x, y):
                errors.append(f"{t.name}: kept as {o.tensor_type.name} but the values changed")
    if n_quant == 0:
        errors.append("no tensor is quantized")
    for e in errors:
        print(f"check_quantize: {path}: {e}", file=sys.stderr)
    print(f"check_quantize: {path}: {qtype.name}, {n_quant} quantized tensors compared with gguf-py's quantizer, worst error "
          f"{worst:.0%} of the bound, "
          f"{'metadata not compared' if tensors_only else f'{len(orig.fields)} metadata fields'}: {'OK' if not errors else 'FAILED'}")
    return not errors


def main():
    args = sys.argv[1:]
    tensors_only = bool(args) and args[0] == "--tensors-only"
    args = args[1:] if tensors_only else args
    if len(args) < 2:
        raise SystemExit(__doc__)
    orig = GGUFReader(args[0])
    ok = all([check(orig, p, tensors_only) for p in args[1:]])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
