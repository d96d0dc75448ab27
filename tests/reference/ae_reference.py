#!/usr/bin/env python3
"""Independent numpy (float64) implementation of the FLUX autoencoder's decoder, written from the formulas in
docs/autoencoder.md, used by tests/torch/test_autoencoder.cpp to check the LibTorch implementation.

Usage: ae_reference.py DIR
  DIR/config.txt    "key value..." lines: z_channels ch ch_mult (one or more values) num_res_blocks out_ch
                    groups eps scale_factor shift_factor
  DIR/manifest.txt  one line per tensor: "name file ndim d0 d1 ..."; each file raw little-endian float32.
                    Weights use the ae.safetensors names (decoder.*); the input is input.latents [B, z, h, w].
Writes DIR/out.bin: the decoded images [B, out_ch, H, W] (not clamped) as raw little-endian float64.
"""
import sys

import numpy as np

from reference_io import load, save


def conv2d(w, name, x):
    """Stride-1 convolution with zero padding k // 2 (k = 1 or 3): a sum of shifted channel mixes."""
    weight, bias = w[name + ".weight"], w[name + ".bias"]
    k = weight.shape[2]
    p = k // 2
    b, _, h, wd = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    out = np.zeros((b, weight.shape[0], h, wd))
    for dy in range(k):
        for dx in range(k):
            window = padded[:, :, dy:dy + h, dx:dx + wd]
            out += np.einsum("oc,bchw->bohw", weight[:, :, dy, dx], window)
    return out + bias[None, :, None, None]


def group_norm(w, name, x, groups, eps):
    b, c, h, wd = x.shape
    g = x.reshape(b, groups, c // groups, h, wd)
    mean = g.mean(axis=(2, 3, 4), keepdims=True)
    var = ((g - mean) ** 2).mean(axis=(2, 3, 4), keepdims=True)
    normed = ((g - mean) / np.sqrt(var + eps)).reshape(b, c, h, wd)
    return normed * w[name + ".weight"][None, :, None, None] + w[name + ".bias"][None, :, None, None]


def swish(x):
    return x / (1.0 + np.exp(-x))


def resnet(w, name, x, groups, eps):
    h = conv2d(w, name + ".conv1", swish(group_norm(w, name + ".norm1", x, groups, eps)))
    h = conv2d(w, name + ".conv2", swish(group_norm(w, name + ".norm2", h, groups, eps)))
    shortcut = conv2d(w, name + ".nin_shortcut", x) if name + ".nin_shortcut.weight" in w else x
    return shortcut + h


def attention(w, name, x, groups, eps):
    b, c, h, wd = x.shape
    normed = group_norm(w, name + ".norm", x, groups, eps)
    # tokens: [B, H*W, C]
    q = conv2d(w, name + ".q", normed).reshape(b, c, h * wd).transpose(0, 2, 1)
    k = conv2d(w, name + ".k", normed).reshape(b, c, h * wd).transpose(0, 2, 1)
    v = conv2d(w, name + ".v", normed).reshape(b, c, h * wd).transpose(0, 2, 1)
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(c)
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights = weights / weights.sum(axis=-1, keepdims=True)
    a = (weights @ v).transpose(0, 2, 1).reshape(b, c, h, wd)
    return x + conv2d(w, name + ".proj_out", a)


def decode(config, w, latents):
    ch_mult = [int(m) for m in config["ch_mult"]]
    blocks = int(config["num_res_blocks"][0]) + 1
    groups = int(config["groups"][0])
    eps = float(config["eps"][0])
    z = latents / float(config["scale_factor"][0]) + float(config["shift_factor"][0])
    h = conv2d(w, "decoder.conv_in", z)
    h = resnet(w, "decoder.mid.block_1", h, groups, eps)
    h = attention(w, "decoder.mid.attn_1", h, groups, eps)
    h = resnet(w, "decoder.mid.block_2", h, groups, eps)
    for level in reversed(range(len(ch_mult))):
        for block in range(blocks):
            h = resnet(w, "decoder.up.%d.block.%d" % (level, block), h, groups, eps)
        if level > 0:
            h = h.repeat(2, axis=2).repeat(2, axis=3)  # nearest-neighbour 2x
            h = conv2d(w, "decoder.up.%d.upsample.conv" % level, h)
    h = swish(group_norm(w, "decoder.norm_out", h, groups, eps))
    return conv2d(w, "decoder.conv_out", h)


def main():
    directory = sys.argv[1]
    config, tensors = load(directory)
    out = decode(config, tensors, tensors["input.latents"])
    save(directory, out)


if __name__ == "__main__":
    main()
