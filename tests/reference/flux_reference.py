#!/usr/bin/env python3
"""Independent numpy (float64) implementation of the FLUX.1 transformer forward, written from the formulas in
docs/flux.md, used by tests/torch/test_flux.cpp to check the LibTorch implementation.

Usage: flux_reference.py DIR
  DIR/config.txt    "key value" lines: in_channels hidden heads depth_double depth_single axes (3 values)
                    theta mlp_ratio guidance_embed
  DIR/manifest.txt  one line per tensor: "name file ndim d0 d1 ..."; each file raw little-endian float32.
                    Weights use the bfl names; inputs are input.x [B, C, H, W], input.txt [B, L, context_in],
                    input.pooled [B, vec_in], input.t [B], input.g [B] (when guidance_embed).
Writes DIR/out.bin: the velocity [B, C, H, W] as raw little-endian float64.
"""
import math
import sys

import numpy as np

from reference_io import load, save


def linear(w, name, x):
    y = x @ w[name + ".weight"].T
    if name + ".bias" in w:
        y = y + w[name + ".bias"]
    return y


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def layer_norm(x, eps=1e-6):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


def rms_norm(x, scale, eps=1e-6):
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * scale


def time_embedding(t, dim=256, factor=1000.0, max_period=10000.0):
    half = dim // 2
    freqs = np.exp(-math.log(max_period) * np.arange(half) / half)
    args = (factor * t)[:, None] * freqs[None, :]
    return np.concatenate([np.cos(args), np.sin(args)], axis=-1)


def rope_angles(ids, axes, theta):
    """ids [L, 3] -> angles [L, sum(axes) / 2]."""
    parts = []
    for a, d in enumerate(axes):
        omega = theta ** (-np.arange(0, d, 2) / d)
        parts.append(ids[:, a:a + 1] * omega[None, :])
    return np.concatenate(parts, axis=-1)


def rotate(x, angles):
    """x [B, H, L, D]: pair (x[2i], x[2i+1]) multiplied by exp(i angle) as a complex number."""
    z = x[..., 0::2] + 1j * x[..., 1::2]
    z = z * np.exp(1j * angles)[None, None]
    out = np.empty_like(x)
    out[..., 0::2] = z.real
    out[..., 1::2] = z.imag
    return out


def heads(x, n):
    b, l, f = x.shape
    return x.reshape(b, l, n, f // n).transpose(0, 2, 1, 3)


def attend(q, k, v, angles):
    q, k = rotate(q, angles), rotate(k, angles)
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    s = np.exp(s - s.max(-1, keepdims=True))
    p = s / s.sum(-1, keepdims=True)
    o = p @ v
    b, h, l, d = o.shape
    return o.transpose(0, 2, 1, 3).reshape(b, l, h * d)


def forward(config, w):
    hidden = int(config["hidden"][0])
    n_heads = int(config["heads"][0])
    depth_double = int(config["depth_double"][0])
    depth_single = int(config["depth_single"][0])
    axes = [int(a) for a in config["axes"]]
    theta = float(config["theta"][0])
    guidance = config["guidance_embed"][0] == "1"

    x = w["input.x"]
    b, c, h, wd = x.shape
    he, we = h + h % 2, wd + wd % 2
    xp = np.zeros((b, c, he, we))
    xp[:, :, :h, :wd] = x
    # pack: token (i, j), feature 4 c + 2 di + dj
    rows, cols = he // 2, we // 2
    img = np.zeros((b, rows * cols, 4 * c))
    for i in range(rows):
        for j in range(cols):
            for ch in range(c):
                for di in range(2):
                    for dj in range(2):
                        img[:, i * cols + j, 4 * ch + 2 * di + dj] = xp[:, ch, 2 * i + di, 2 * j + dj]
    txt = w["input.txt"]
    n_txt = txt.shape[1]
    ids = np.zeros((n_txt + rows * cols, 3))
    for i in range(rows):
        for j in range(cols):
            ids[n_txt + i * cols + j] = (0, i, j)
    angles = rope_angles(ids, axes, theta)

    def mlp_embed(name, v):
        return linear(w, name + ".out_layer", silu(linear(w, name + ".in_layer", v)))

    vec = mlp_embed("time_in", time_embedding(w["input.t"]))
    if guidance:
        vec = vec + mlp_embed("guidance_in", time_embedding(w["input.g"]))
    vec = vec + mlp_embed("vector_in", w["input.pooled"])
    img = linear(w, "img_in", img)
    txt = linear(w, "txt_in", txt)

    def mod(name, count):
        out = linear(w, name, silu(vec))[:, None, :]
        return [out[..., k * hidden:(k + 1) * hidden] for k in range(count)]

    def qkv(prefix, x_mod, norm_prefix):
        y = linear(w, prefix, x_mod)
        q, k, v = (heads(y[..., s * hidden:(s + 1) * hidden], n_heads) for s in range(3))
        q = rms_norm(q, w[norm_prefix + ".query_norm.scale"])
        k = rms_norm(k, w[norm_prefix + ".key_norm.scale"])
        return q, k, v

    for n in range(depth_double):
        p = f"double_blocks.{n}."
        im = mod(p + "img_mod.lin", 6)
        tm = mod(p + "txt_mod.lin", 6)
        iq, ik, iv = qkv(p + "img_attn.qkv", (1 + im[1]) * layer_norm(img) + im[0], p + "img_attn.norm")
        tq, tk, tv = qkv(p + "txt_attn.qkv", (1 + tm[1]) * layer_norm(txt) + tm[0], p + "txt_attn.norm")
        o = attend(np.concatenate([tq, iq], 2), np.concatenate([tk, ik], 2), np.concatenate([tv, iv], 2), angles)
        t_o, i_o = o[:, :n_txt], o[:, n_txt:]
        img = img + im[2] * linear(w, p + "img_attn.proj", i_o)
        img = img + im[5] * linear(w, p + "img_mlp.2", gelu_tanh(linear(w, p + "img_mlp.0",
                                                                       (1 + im[4]) * layer_norm(img) + im[3])))
        txt = txt + tm[2] * linear(w, p + "txt_attn.proj", t_o)
        txt = txt + tm[5] * linear(w, p + "txt_mlp.2", gelu_tanh(linear(w, p + "txt_mlp.0",
                                                                       (1 + tm[4]) * layer_norm(txt) + tm[3])))
    s = np.concatenate([txt, img], 1)
    for n in range(depth_single):
        p = f"single_blocks.{n}."
        m = mod(p + "modulation.lin", 3)
        y = linear(w, p + "linear1", (1 + m[1]) * layer_norm(s) + m[0])
        q, k, v = (heads(y[..., j * hidden:(j + 1) * hidden], n_heads) for j in range(3))
        q = rms_norm(q, w[p + "norm.query_norm.scale"])
        k = rms_norm(k, w[p + "norm.key_norm.scale"])
        o = attend(q, k, v, angles)
        s = s + m[2] * linear(w, p + "linear2", np.concatenate([o, gelu_tanh(y[..., 3 * hidden:])], -1))
    img = s[:, n_txt:]
    ada = linear(w, "final_layer.adaLN_modulation.1", silu(vec))[:, None, :]
    shift, scale = ada[..., :hidden], ada[..., hidden:]
    out = linear(w, "final_layer.linear", (1 + scale) * layer_norm(img) + shift)
    # unpack and crop
    v = np.zeros((b, c, he, we))
    for i in range(rows):
        for j in range(cols):
            for ch in range(c):
                for di in range(2):
                    for dj in range(2):
                        v[:, ch, 2 * i + di, 2 * j + dj] = out[:, i * cols + j, 4 * ch + 2 * di + dj]
    return v[:, :, :h, :wd]


def main():
    directory = sys.argv[1]
    config, tensors = load(directory)
    out = forward(config, tensors)
    save(directory, out)


if __name__ == "__main__":
    main()
