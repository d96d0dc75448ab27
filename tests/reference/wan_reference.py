#!/usr/bin/env python3
"""Independent numpy (float64) implementation of the Wan2.1 text-to-video transformer forward, written from the
formulas in docs/wan.md, used by tests/torch/test_wan.cpp to check the LibTorch implementation.

Usage: wan_reference.py DIR
  DIR/config.txt    "key value" lines: dim heads layers freq_dim text_len out_dim patch (3 values) eps theta
  DIR/manifest.txt  one line per tensor: "name file ndim d0 d1 ..."; each file raw little-endian float32.
                    Weights use the official names; inputs are input.x [B, C_in, F, H, W], input.t [B],
                    input.text [B, L, text_dim] (L <= text_len).
Writes DIR/out.bin: the velocity [B, C_out, F, H, W] as raw little-endian float64.
"""
import math
import sys

import numpy as np

from reference_io import load, save


def linear(w, name, x):
    return x @ w[name + ".weight"].T + w[name + ".bias"]


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def layer_norm(x, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


def rms_norm(x, weight, eps):
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * weight


def sinusoid(t, dim):
    half = dim // 2
    freqs = 10000.0 ** (-np.arange(half) / half)
    args = t[:, None] * freqs[None, :]
    return np.concatenate([np.cos(args), np.sin(args)], axis=-1)


def split_heads(x, n):
    b, l, f = x.shape
    return x.reshape(b, l, n, f // n).transpose(0, 2, 1, 3)


def rotate(x, angles):
    """x [B, H, L, D]: pair (x[2i], x[2i+1]) times exp(i angle) as a complex number; angles [L, D/2]."""
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * angles)[None, None]
    out = np.empty_like(x)
    out[..., 0::2] = z.real
    out[..., 1::2] = z.imag
    return out


def attend(q, k, v):
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    o = p @ v
    b, h, l, d = o.shape
    return o.transpose(0, 2, 1, 3).reshape(b, l, h * d)


def forward(config, w):
    dim = int(config["dim"][0])
    n_heads = int(config["heads"][0])
    layers = int(config["layers"][0])
    freq_dim = int(config["freq_dim"][0])
    text_len = int(config["text_len"][0])
    out_dim = int(config["out_dim"][0])
    pt, ph, pw = (int(v) for v in config["patch"])
    eps = float(config["eps"][0])
    theta = float(config["theta"][0])
    d = dim // n_heads

    x = w["input.x"]
    b, cin, F, H, W = x.shape
    gf, gh, gw = -(-F // pt), -(-H // ph), -(-W // pw)
    xp = np.zeros((b, cin, gf * pt, gh * ph, gw * pw))
    xp[:, :, :F, :H, :W] = x
    # patch embedding: a 3-D convolution with kernel = stride = patch, as a sum over the kernel cells
    kernel = w["patch_embedding.weight"]  # [dim, cin, pt, ph, pw]
    n = gf * gh * gw
    tokens = np.zeros((b, n, dim))
    positions = np.zeros((n, 3))
    for i in range(gf):
        for j in range(gh):
            for k in range(gw):
                token = (i * gh + j) * gw + k
                positions[token] = (i, j, k)
                cell = xp[:, :, i * pt:(i + 1) * pt, j * ph:(j + 1) * ph, k * pw:(k + 1) * pw]
                tokens[:, token] = np.einsum("bcpqr,ocpqr->bo", cell, kernel) + w["patch_embedding.bias"]

    # RoPE: frame axis d - 4 (d // 6) dims, rows and columns 2 (d // 6) each; own frequencies per axis
    side = 2 * (d // 6)
    parts = []
    for axis, width in enumerate([d - 2 * side, side, side]):
        omega = theta ** (-np.arange(0, width, 2) / width)
        parts.append(positions[:, axis:axis + 1] * omega[None, :])
    angles = np.concatenate(parts, axis=-1)  # [N, d / 2]

    e = linear(w, "time_embedding.2", silu(linear(w, "time_embedding.0", sinusoid(w["input.t"], freq_dim))))
    e0 = linear(w, "time_projection.1", silu(e)).reshape(b, 6, dim)
    text = w["input.text"]
    padded = np.zeros((b, text_len, text.shape[2]))
    padded[:, :text.shape[1]] = text
    context = linear(w, "text_embedding.2", gelu_tanh(linear(w, "text_embedding.0", padded)))

    def attention(prefix, xq, source, rope):
        q = split_heads(rms_norm(linear(w, prefix + "q", xq), w[prefix + "norm_q.weight"], eps), n_heads)
        k = split_heads(rms_norm(linear(w, prefix + "k", source), w[prefix + "norm_k.weight"], eps), n_heads)
        v = split_heads(linear(w, prefix + "v", source), n_heads)
        if rope:
            q, k = rotate(q, angles), rotate(k, angles)
        return linear(w, prefix + "o", attend(q, k, v))

    h = tokens
    for layer in range(layers):
        p = f"blocks.{layer}."
        m = w[p + "modulation"] + e0  # [B, 6, dim]
        shift1, scale1, gate1, shift2, scale2, gate2 = (m[:, i:i + 1] for i in range(6))
        y = layer_norm(h, eps) * (1 + scale1) + shift1
        h = h + attention(p + "self_attn.", y, y, True) * gate1
        y = layer_norm(h, eps) * w[p + "norm3.weight"] + w[p + "norm3.bias"]
        h = h + attention(p + "cross_attn.", y, context, False)
        y = layer_norm(h, eps) * (1 + scale2) + shift2
        h = h + linear(w, p + "ffn.2", gelu_tanh(linear(w, p + "ffn.0", y))) * gate2
    m = w["head.modulation"] + e[:, None, :]
    shift, scale = m[:, 0:1], m[:, 1:2]
    out = linear(w, "head.head", layer_norm(h, eps) * (1 + scale) + shift)  # [B, N, pt ph pw C_out]

    v = np.zeros((b, out_dim, gf * pt, gh * ph, gw * pw))
    for i in range(gf):
        for j in range(gh):
            for k in range(gw):
                token = (i * gh + j) * gw + k
                for a in range(pt):
                    for c in range(ph):
                        for r in range(pw):
                            feature = ((a * ph + c) * pw + r) * out_dim
                            v[:, :, i * pt + a, j * ph + c, k * pw + r] = out[:, token, feature:feature + out_dim]
    return v[:, :, :F, :H, :W]


def main():
    directory = sys.argv[1]
    config, tensors = load(directory)
    save(directory, forward(config, tensors))


if __name__ == "__main__":
    main()
