#!/usr/bin/env python3
"""Writes the seed corpus of the safetensors fuzzer (fuzz/corpus/, checked in): small valid files
(valid_*), malformed ones (invalid_*) and shard index texts (index_valid_*, index_invalid_*).
Independent of the C++ writer, so the corpus also cross-checks the reader: tests/unit/test_safetensors.cpp
requires every valid_* file to parse and every invalid_* file to be rejected.

    python3 fuzz/make_corpus.py [fuzz/corpus]
"""
import json
import os
import struct
import sys

SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
         "U8": 1, "BOOL": 1}


def file_bytes(header, data=b"", pad=True, raw_header=None):
    text = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def tensors(entries, metadata=None):
    """entries: (name, dtype, shape) -> a valid file with counting bytes as data."""
    header, offset = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape in entries:
        count = SIZES[dtype]
        for extent in shape:
            count *= extent
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + count]}
        offset += count
    return file_bytes(header, bytes(i % 251 for i in range(offset)))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    os.makedirs(out, exist_ok=True)
    seeds = {
        "valid_empty": file_bytes({}),
        "valid_f32": tensors([("w", "F32", [2, 2])]),
        "valid_every_dtype": tensors([(f"t_{d.lower()}", d, [3]) for d in SIZES]),
        "valid_metadata": tensors([("a", "BF16", [4]), ("b", "F16", [1, 2])], {"format": "pt", "k": "\u00e9\n"}),
        "valid_scalar_and_empty": tensors([("s", "F32", []), ("z", "F32", [0, 5]), ("u", "U8", [2])]),
        "valid_unpadded": file_bytes({"x": {"dtype": "I8", "shape": [1], "data_offsets": [0, 1]}}, b"\x07", pad=False),
        "valid_escapes": tensors([("a\"\\/\u00e9\U0001F600\t", "F8_E4M3", [2])]),
        "valid_flux_bfl": tensors([("img_in.weight", "BF16", [4, 2]), ("img_in.bias", "BF16", [4]),
                                   ("double_blocks.0.img_attn.qkv.weight", "BF16", [12, 4])]),
        "invalid_truncated_length": b"\x10\x00\x00",
        "invalid_header_past_end": struct.pack("<Q", 1000) + b"{}",
        "invalid_huge_header_length": struct.pack("<Q", 2**63) + b"{}",
        "invalid_bad_json": file_bytes(None, raw_header=b'{"a":{"dtype":"F32",}'),
        "invalid_duplicate_key": file_bytes(None, raw_header=b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                                             b'"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}',
                                            data=b"\x01\x02"),
        "invalid_unknown_dtype": file_bytes({"a": {"dtype": "F12", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
        "invalid_size_mismatch": file_bytes({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}},
                                            b"\0" * 12),
        "invalid_out_of_bounds": file_bytes({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8),
        "invalid_overlap": file_bytes({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                       "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12),
        "invalid_gap": file_bytes({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                   "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, b"\0" * 12),
        "invalid_metadata_not_string": file_bytes({"__metadata__": {"k": 1}}),
        "invalid_negative_shape": file_bytes(None, raw_header=b'{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}}'),
        "invalid_float_offset": file_bytes(None, raw_header=b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}}',
                                           data=b"\0" * 4),
        "invalid_shape_overflow": file_bytes({"a": {"dtype": "F64", "shape": [2**32, 2**32], "data_offsets": [0, 0]}}),
        "invalid_lone_surrogate": file_bytes(None, raw_header=b'{"\\ud800":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}'),
        "invalid_trailing_bytes": tensors([("a", "U8", [1])]) + b"\0",
        "index_valid": json.dumps({"metadata": {"total_size": 24, "format": "pt"},
                                   "weight_map": {"a": "model-00001-of-00002.safetensors",
                                                  "b": "model-00002-of-00002.safetensors"}}).encode(),
        "index_invalid_absolute": json.dumps({"weight_map": {"a": "/etc/passwd"}}).encode(),
        "index_invalid_parent": json.dumps({"weight_map": {"a": "../x.safetensors"}}).encode(),
        "index_invalid_no_weight_map": json.dumps({"metadata": {}}).encode(),
    }
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(seeds)} seeds to {out}")


if __name__ == "__main__":
    main()
