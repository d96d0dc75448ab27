#!/usr/bin/env python3
"""Writes rows [first, last) of a prompt embeddings file (safetensors: context [N, T, D], pooled [N, V] float32
and the prompts, one per line, in the metadata) as a new prompt file. The standard library only: a test helper that
splits the shipped model's prompts into trained and held-out ones.

Usage: split_prompt_file.py IN.safetensors OUT.safetensors FIRST LAST
"""
import json
import struct
import sys


def main(source, target, first, last):
    data = open(source, "rb").read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    body = data[8 + length :]
    metadata = dict(header.pop("__metadata__", {}))
    prompts = metadata["prompts"].split("\n")
    if not 0 <= first < last <= len(prompts):
        sys.exit(f"{source}: rows [{first}, {last}) are not within its {len(prompts)} prompts")
    metadata["prompts"] = "\n".join(prompts[first:last])
    tensors, chunks, offset = {}, [], 0
    for name in sorted(header, key=lambda n: header[n]["data_offsets"][0]):
        entry = header[name]
        if entry["dtype"] != "F32":
            sys.exit(f"{source}: {name} is {entry['dtype']}, this helper splits F32 tensors")
        start, end = entry["data_offsets"]
        row = (end - start) // entry["shape"][0]
        chunk = body[start + first * row : start + last * row]
        tensors[name] = {"dtype": "F32", "shape": [last - first] + entry["shape"][1:],
                         "data_offsets": [offset, offset + len(chunk)]}
        chunks.append(chunk)
        offset += len(chunk)
    text = json.dumps({"__metadata__": metadata, **tensors}).encode()
    text += b" " * (-len(text) % 8)
    with open(target, "wb") as out:
        out.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
