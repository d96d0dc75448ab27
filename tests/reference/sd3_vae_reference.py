#!/usr/bin/env python3
"""Writes tests/reference/fixtures/sd3_vae.safetensors, the reference tests/torch/test_sd3_vae.cpp checks SD3's
VAE decoder (adapters/torch/branchgrpo/torch/sd3/autoencoder.hpp) against: a tiny diffusers AutoencoderKL with
SD3's layout (no quant convs, scaling_factor 1.5305, shift_factor 0.0609), seeded random weights, and fixed
latents decoded the way diffusers' StableDiffusion3Pipeline decodes them:

    images = vae.decode(latents / vae.config.scaling_factor + vae.config.shift_factor).sample

Tensors written (the weights rounded to float32 first, the decode then run in float64 on those values):
  diffusers.decoder.*   F32  the decoder's weights in diffusers' names (the C++ loader must map them)
  input.latents         F32  [2, 16, 3, 5], normalized (the transformer's space)
  output.images         F64  [2, 3, 12, 20], not clamped
__metadata__: "config" (the AutoencoderKL config as JSON), "flux_autoencoder_config" (the same shape in
flux_autoencoder_config's terms), "torch", "diffusers", "generator".

Usage (diffusers is only run here, never copied): .venv/bin/python tests/reference/sd3_vae_reference.py [OUT]
"""

import json
import os
import sys

import diffusers
import torch
from diffusers import AutoencoderKL
from safetensors.torch import save_file

CONFIG = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 3,
    up_block_types=("UpDecoderBlock2D",) * 3,
    block_out_channels=(8, 16, 16),
    layers_per_block=1,
    latent_channels=16,
    norm_num_groups=4,
    scaling_factor=1.5305,
    shift_factor=0.0609,
    use_quant_conv=False,
    use_post_quant_conv=False,
)
LATENTS_SHAPE = (2, 16, 3, 5)
SEED = 20250315


def randomize(vae, generator):
    """Weights N(0, 1 / fan_in), biases N(0, 0.1^2), GroupNorm scales 1 + N(0, 0.2^2) and shifts N(0, 0.2^2),
    each rounded to float32 (the fixture stores float32)."""
    with torch.no_grad():
        for name, p in vae.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float64)
            norm = "norm" in name
            if p.dim() == 1:
                value = (1.0 if norm and name.endswith(".weight") else 0.0) + noise * (0.2 if norm else 0.1)
            else:
                value = noise / (p[0].numel() ** 0.5)
            p.copy_(value.to(torch.float32).to(torch.float64))


def main():
    out = (
        sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "fixtures", "sd3_vae.safetensors")
    )
    generator = torch.Generator().manual_seed(SEED)
    vae = AutoencoderKL(**CONFIG).to(torch.float64).eval()
    randomize(vae, generator)
    latents = torch.randn(LATENTS_SHAPE, generator=generator, dtype=torch.float64).to(torch.float32)
    with torch.no_grad():
        z = latents.to(torch.float64) / vae.config.scaling_factor + vae.config.shift_factor
        images = vae.decode(z).sample

    tensors = {
        "diffusers." + name: t.to(torch.float32).contiguous()
        for name, t in vae.state_dict().items()
        if name.startswith("decoder.")
    }
    tensors["input.latents"] = latents.contiguous()
    tensors["output.images"] = images.contiguous()
    flux_config = dict(
        z_channels=CONFIG["latent_channels"],
        ch=CONFIG["block_out_channels"][0],
        ch_mult=[c // CONFIG["block_out_channels"][0] for c in CONFIG["block_out_channels"]],
        num_res_blocks=CONFIG["layers_per_block"],
        groups=CONFIG["norm_num_groups"],
        scale_factor=CONFIG["scaling_factor"],
        shift_factor=CONFIG["shift_factor"],
    )
    metadata = {
        "config": json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in CONFIG.items()}),
        "flux_autoencoder_config": json.dumps(flux_config),
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "generator": f"tests/reference/sd3_vae_reference.py, seed {SEED}",
    }
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    save_file(tensors, out, metadata=metadata)
    print(f"{out}: {len(tensors)} tensors, {os.path.getsize(out)} bytes, images max |x| {images.abs().max():.4f}")


if __name__ == "__main__":
    main()
