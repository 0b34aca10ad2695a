#!/usr/bin/env python3
"""same_tensors.py SAVED LOADED...: whether every LOADED file holds SAVED's tensors, the same
names, shapes and bytes (safetensors files, as ddp-train's --dump-init and --dump-final write
them). Prints the number of tensors and exits 0 when they all do; else names the first that
differs and exits 1."""
import json
import struct
import sys


def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        data = f.read()
    h.pop("__metadata__", None)
    return {k: (v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in h.items()}


saved = tensors(sys.argv[1])
for path in sys.argv[2:]:
    got = tensors(path)
    if got.keys() != saved.keys():
        sys.exit(f"{path}: tensors {sorted(got)}, saved {sorted(saved)}")
    for k in saved:
        if got[k] != saved[k]:
            sys.exit(f"{path}: {k} differs from the saved values")
print(len(saved))
