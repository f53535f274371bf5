#!/usr/bin/env python3
"""Dequantizes every tensor of a GGUF file with gguf-py and writes one line per tensor:

    name <TAB> ggml type id <TAB> element count <TAB> absolute file offset of the data <TAB> sha256

where sha256 is over the float32 little-endian values (gguf.quants.dequantize). The kiln side
(dequant_sha256.cpp) recomputes the same from the same offsets. Usage: gguf_dequant_sha256.py MODEL OUT
"""
import hashlib
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    reader = GGUFReader(sys.argv[1])
    with open(sys.argv[2], "w") as out:
        for t in reader.tensors:
            with np.errstate(all="ignore"):
                values = np.ascontiguousarray(dequantize(np.asarray(t.data), t.tensor_type), dtype="<f4")
            assert values.size == int(t.n_elements), (t.name, values.size, t.n_elements)
            digest = hashlib.sha256(values.tobytes()).hexdigest()
            out.write(f"{t.name}\t{int(t.tensor_type)}\t{int(t.n_elements)}\t{int(t.data_offset)}\t{digest}\n")


if __name__ == "__main__":
    main()
