#!/usr/bin/env python3
"""Independent numpy (float64) implementation of the Wan2.1 VAE's decoder, written from the formulas in
adapters/torch/branchgrpo/torch/wan/autoencoder.hpp's file comment, used by tests/torch/test_wan_vae.cpp to check
the LibTorch implementation. It decodes the whole clip at once (the C++ decodes chunk by chunk by default).

Usage: wan_vae_reference.py DIR
  DIR/config.txt    "key value..." lines: z_dim dim dim_mult (values) num_res_blocks temporal_upsample (0/1
                    values, decoder order) latents_mean (z_dim values) latents_std (z_dim values)
  DIR/manifest.txt  one line per tensor: "name file ndim d0 d1 ..."; each file raw little-endian float32.
                    Weights use the Wan2.1_VAE.pth names (conv2.*, decoder.*); the input is input.latents
                    [B, z_dim, T, h, w].
Writes DIR/out.bin: the decoded video [B, 3, 1 + s (T - 1), H, W] (not clamped) as raw little-endian float64.
"""
import sys

import numpy as np

from reference_io import load, save


def causal_conv3d(w, name, x):
    """Kernel (kt, k, k): kt - 1 zero frames before the clip (none after), k // 2 zero pixels around each frame."""
    weight, bias = w[name + ".weight"], w[name + ".bias"]
    kt, k = weight.shape[2], weight.shape[3]
    p = k // 2
    b, _, t, h, wd = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (kt - 1, 0), (p, p), (p, p)))
    out = np.zeros((b, weight.shape[0], t, h, wd))
    for dt in range(kt):
        for dy in range(k):
            for dx in range(k):
                window = padded[:, :, dt:dt + t, dy:dy + h, dx:dx + wd]
                out += np.einsum("oc,bcthw->bothw", weight[:, :, dt, dy, dx], window)
    return out + bias[None, :, None, None, None]


def conv2d_frames(w, name, x):
    """A 2-D conv (k = 1 or 3, padding k // 2) on every frame of [B, C, T, H, W]: a causal conv with kt = 1."""
    weight = w[name + ".weight"]
    return causal_conv3d({name + ".weight": weight[:, :, None], name + ".bias": w[name + ".bias"]}, name, x)


def rms_norm(w, name, x):
    gamma = w[name + ".gamma"].reshape(-1)
    norm = np.maximum(np.sqrt((x ** 2).sum(axis=1, keepdims=True)), 1e-12)
    return x / norm * np.sqrt(x.shape[1]) * gamma[None, :, None, None, None]


def silu(x):
    return x / (1.0 + np.exp(-x))


def residual(w, name, x):
    h = causal_conv3d(w, name + ".residual.2", silu(rms_norm(w, name + ".residual.0", x)))
    h = causal_conv3d(w, name + ".residual.6", silu(rms_norm(w, name + ".residual.3", h)))
    shortcut = causal_conv3d(w, name + ".shortcut", x) if name + ".shortcut.weight" in w else x
    return shortcut + h


def attention(w, name, x):
    b, c, t, h, wd = x.shape
    qkv = conv2d_frames(w, name + ".to_qkv", rms_norm(w, name + ".norm", x))
    # tokens per frame: [B, T, H*W, C]
    tokens = lambda a: a.reshape(b, c, t, h * wd).transpose(0, 2, 3, 1)
    q, k, v = tokens(qkv[:, :c]), tokens(qkv[:, c:2 * c]), tokens(qkv[:, 2 * c:])
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(c)
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights = weights / weights.sum(axis=-1, keepdims=True)
    a = (weights @ v).transpose(0, 3, 1, 2).reshape(b, c, t, h, wd)
    return x + conv2d_frames(w, name + ".proj", a)


def resample(w, name, x, temporal):
    if temporal:
        # Frame 0 passes; frames 1.. go through the causal time conv (its zero padding before frame 1), whose
        # output channel halves [C, 2C) become frames 2i and 2i + 1 of the doubled rest.
        c = x.shape[1]
        rest = causal_conv3d(w, name + ".time_conv", x[:, :, 1:])
        b, _, t, h, wd = rest.shape
        doubled = np.stack([rest[:, :c], rest[:, c:]], axis=3).reshape(b, c, 2 * t, h, wd)
        x = np.concatenate([x[:, :, :1], doubled], axis=2)
    x = x.repeat(2, axis=3).repeat(2, axis=4)  # nearest-neighbour 2x in space
    return conv2d_frames(w, name + ".resample.1", x)


def decode(config, w, latents):
    dim = int(config["dim"][0])
    dim_mult = [int(m) for m in config["dim_mult"]]
    blocks = int(config["num_res_blocks"][0]) + 1
    temporal = [v == "1" for v in config.get("temporal_upsample", [])]
    mean = np.array([float(v) for v in config["latents_mean"]])
    std = np.array([float(v) for v in config["latents_std"]])
    z = latents * std[None, :, None, None, None] + mean[None, :, None, None, None]
    x = causal_conv3d(w, "conv2", z)
    x = causal_conv3d(w, "decoder.conv1", x)
    x = residual(w, "decoder.middle.0", x)
    x = attention(w, "decoder.middle.1", x)
    x = residual(w, "decoder.middle.2", x)
    index = 0
    for level in range(len(dim_mult)):
        for _ in range(blocks):
            x = residual(w, "decoder.upsamples.%d" % index, x)
            index += 1
        if level + 1 < len(dim_mult):
            x = resample(w, "decoder.upsamples.%d" % index, x, temporal[level])
            index += 1
    assert x.shape[1] == dim * dim_mult[0]
    x = silu(rms_norm(w, "decoder.head.0", x))
    return causal_conv3d(w, "decoder.head.2", x)


def main():
    directory = sys.argv[1]
    config, tensors = load(directory)
    out = decode(config, tensors, tensors["input.latents"])
    save(directory, out)


if __name__ == "__main__":
    main()
