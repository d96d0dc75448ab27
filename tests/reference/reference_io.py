"""The exchange format between the C++ tests and the numpy references (flux_reference.py, ae_reference.py).

  DIR/config.txt    one "key value..." line per setting
  DIR/manifest.txt  one line per tensor: "name file ndim d0 d1 ..."; each file raw little-endian float32
  DIR/out.bin       written by the reference: its result as raw little-endian float64
Written on the C++ side by tests/support/numpy_reference.hpp.
"""

import os

import numpy as np


def load(directory):
    """Returns (config: key -> list of strings, tensors: name -> float64 array)."""
    config = {}
    with open(os.path.join(directory, "config.txt")) as f:
        for line in f:
            parts = line.split()
            if parts:
                config[parts[0]] = parts[1:]
    tensors = {}
    with open(os.path.join(directory, "manifest.txt")) as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            name, file, ndim = parts[0], parts[1], int(parts[2])
            shape = tuple(int(d) for d in parts[3:3 + ndim])
            data = np.fromfile(os.path.join(directory, file), dtype="<f4").astype(np.float64)
            tensors[name] = data.reshape(shape)
    return config, tensors


def save(directory, out):
    """Writes the result as DIR/out.bin (float64)."""
    np.asarray(out, dtype=np.float64).astype("<f8").tofile(os.path.join(directory, "out.bin"))
