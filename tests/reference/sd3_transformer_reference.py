#!/usr/bin/env python3
"""Writes tests/reference/fixtures/sd3_transformer.safetensors, the fixture tests/torch/test_sd3.cpp checks the native
SD3.5 transformer (adapters/torch/branchgrpo/torch/sd3/transformer.hpp) against: the output of diffusers' own
SD3Transformer2DModel on random weights.

The model is sd3_config::tiny() (adapters/model_specs/branchgrpo/model_specs/sd3/config.hpp): 4 latent channels,
hidden 20 in 2 heads of 10, 2 joint blocks with the MMDiT-X second self-attention in block 0 and q/k RMSNorm, an 8 x 8
learned position grid, context 16 wide, pooled 12 wide. Steps:
  1. random weights (seeded) under the names of Stability AI's single-file checkpoints (joint_blocks.N.x_block.attn.
     qkv, ..., written here from the layout, not taken from diffusers), float32;
  2. those converted to diffusers' names by diffusers' own converter
     (diffusers.loaders.single_file_utils.convert_sd3_transformer_checkpoint_to_diffusers) and loaded, strictly, into
     an SD3Transformer2DModel of the same shape in float64;
  3. its forward on 2 rows of a 4 x 6 latent (2 x 3 patches: the 8 x 8 position grid is cropped at rows 3..4,
     columns 2..4, floor((8 - 3) / 2) = 2), different timesteps (1000 sigma), 5 context tokens and a pooled vector.
The fixture holds "stability.<name>" and "diffusers.<name>" weights (F32), input.x / input.timestep / input.context /
input.pooled (F32), output.velocity (F64, computed in float64 from the F32 values) and __metadata__:
"branchgrpo.sd3_config" (format_sd3_config's text), "diffusers_version", "torch_version", "seed".

Regenerate (from the source tree's root, with the project's venv: torch and diffusers installed):
  .venv/bin/python tests/reference/sd3_transformer_reference.py [OUTPUT]
OUTPUT defaults to tests/reference/fixtures/sd3_transformer.safetensors. For one torch and diffusers version the run
writes the same tensors (the order of the __metadata__ entries in the header may vary); commit the file it writes.
"""

import pathlib
import sys

import diffusers
import torch
from diffusers import SD3Transformer2DModel
from diffusers.loaders.single_file_utils import convert_sd3_transformer_checkpoint_to_diffusers
from safetensors.torch import save_file

SEED = 20240613
# sd3_config::tiny(), in format_sd3_config's field order.
CONFIG = {
    "in_channels": 4,
    "out_channels": 4,
    "patch": 2,
    "hidden": 20,
    "heads": 2,
    "depth": 2,
    "pos_embed_max_size": 8,
    "sample_size": 16,
    "context_in": 16,
    "pooled_in": 12,
    "qk_norm": 1,
    "dual_attention_layers": 1,
}


def config_text(c):
    return ";".join(f"{key}={value}" for key, value in c.items())


def stability_shapes(c):
    """{name: shape} of the Stability single-file layout (prefix model.diffusion_model. removed)."""
    h, m, d = c["hidden"], 4 * c["hidden"], c["hidden"] // c["heads"]
    shapes = {
        "pos_embed": (1, c["pos_embed_max_size"] ** 2, h),
        "x_embedder.proj.weight": (h, c["in_channels"], c["patch"], c["patch"]),
        "x_embedder.proj.bias": (h,),
    }

    def linear(name, fan_in, fan_out):
        shapes[name + ".weight"] = (fan_out, fan_in)
        shapes[name + ".bias"] = (fan_out,)

    def attention(prefix, with_proj):
        linear(prefix + "qkv", h, 3 * h)
        if c["qk_norm"]:
            shapes[prefix + "ln_q.weight"] = (d,)
            shapes[prefix + "ln_k.weight"] = (d,)
        if with_proj:
            linear(prefix + "proj", h, h)

    linear("t_embedder.mlp.0", 256, h)
    linear("t_embedder.mlp.2", h, h)
    linear("y_embedder.mlp.0", c["pooled_in"], h)
    linear("y_embedder.mlp.2", h, h)
    linear("context_embedder", c["context_in"], h)
    for i in range(c["depth"]):
        pre_only = i == c["depth"] - 1
        dual = i < c["dual_attention_layers"]
        ctx, x = f"joint_blocks.{i}.context_block.", f"joint_blocks.{i}.x_block."
        attention(ctx + "attn.", not pre_only)
        if not pre_only:
            linear(ctx + "mlp.fc1", h, m)
            linear(ctx + "mlp.fc2", m, h)
        linear(ctx + "adaLN_modulation.1", h, (2 if pre_only else 6) * h)
        attention(x + "attn.", True)
        if dual:
            attention(x + "attn2.", True)
        linear(x + "mlp.fc1", h, m)
        linear(x + "mlp.fc2", m, h)
        linear(x + "adaLN_modulation.1", h, (9 if dual else 6) * h)
    linear("final_layer.linear", h, c["patch"] ** 2 * c["out_channels"])
    linear("final_layer.adaLN_modulation.1", h, 2 * h)
    return shapes


def random_weights(shapes, generator):
    """Weights that all matter: norm scales 1 + N(0, 0.2^2); pos_embed N(0, 0.5^2); linear and conv weights
    N(0, 1 / fan_in) (unit-size activations through the 256-wide time embedding too) and biases N(0, 0.1^2)."""
    out = {}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=generator, dtype=torch.float32)
        if name.endswith(("ln_q.weight", "ln_k.weight")):
            out[name] = 1 + 0.2 * noise
        elif name == "pos_embed":
            out[name] = 0.5 * noise
        elif name.endswith(".bias"):
            out[name] = 0.1 * noise
        else:
            fan_in = 1
            for size in shape[1:]:
                fan_in *= size
            out[name] = noise / fan_in**0.5
    return out


def diffusers_model(c):
    return SD3Transformer2DModel(
        sample_size=c["sample_size"],
        patch_size=c["patch"],
        in_channels=c["in_channels"],
        num_layers=c["depth"],
        attention_head_dim=c["hidden"] // c["heads"],
        num_attention_heads=c["heads"],
        joint_attention_dim=c["context_in"],
        caption_projection_dim=c["hidden"],
        pooled_projection_dim=c["pooled_in"],
        out_channels=c["out_channels"],
        pos_embed_max_size=c["pos_embed_max_size"],
        dual_attention_layers=tuple(range(c["dual_attention_layers"])),
        qk_norm="rms_norm" if c["qk_norm"] else None,
    )


def main():
    output = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "tests/reference/fixtures/sd3_transformer.safetensors")
    generator = torch.Generator().manual_seed(SEED)
    stability = random_weights(stability_shapes(CONFIG), generator)
    converted = convert_sd3_transformer_checkpoint_to_diffusers({k: v.clone() for k, v in stability.items()})
    converted = {name: tensor.contiguous() for name, tensor in converted.items()}

    model = diffusers_model(CONFIG).to(torch.float64).eval()
    model.load_state_dict({name: tensor.to(torch.float64) for name, tensor in converted.items()}, strict=True)

    inputs = {
        "input.x": torch.randn(2, CONFIG["in_channels"], 4, 6, generator=generator),
        "input.timestep": torch.tensor([250.0, 730.0]),
        "input.context": torch.randn(2, 5, CONFIG["context_in"], generator=generator),
        "input.pooled": torch.randn(2, CONFIG["pooled_in"], generator=generator),
    }
    with torch.no_grad():
        velocity = model(
            hidden_states=inputs["input.x"].to(torch.float64),
            encoder_hidden_states=inputs["input.context"].to(torch.float64),
            pooled_projections=inputs["input.pooled"].to(torch.float64),
            timestep=inputs["input.timestep"].to(torch.float64),
            return_dict=False,
        )[0]

    tensors = {"stability." + name: tensor for name, tensor in stability.items()}
    tensors.update({"diffusers." + name: tensor for name, tensor in converted.items()})
    tensors.update(inputs)
    tensors["output.velocity"] = velocity.contiguous()
    metadata = {
        "branchgrpo.sd3_config": config_text(CONFIG),
        "diffusers_version": diffusers.__version__,
        "torch_version": torch.__version__,
        "seed": str(SEED),
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(output), metadata=metadata)
    print(
        f"{output}: {len(stability)} stability + {len(converted)} diffusers tensors, velocity max |v| "
        f"{velocity.abs().max().item():.4f}, {output.stat().st_size} bytes"
    )


if __name__ == "__main__":
    main()
