"""Writes tests/reference/fixtures/wan22_switch.safetensors: diffusers' Wan2.2 expert switch, step by step.

diffusers' WanPipeline with two tiny random WanTransformer3DModel experts (transformer = the high-noise expert,
transformer_2 = the low-noise one) and boundary_ratio 0.6 samples 6 Euler steps (FlowMatchEulerDiscreteScheduler,
shift 3), guidance_scale 1 (no CFG, no text encoder: prompt_embeds are given), output_type "latent". Forward hooks on
both experts record each step's timestep, the expert the pipeline called, its input latents and its velocity.
tests/torch/test_wan22.cpp loads the experts through load_wan22_weights and checks that wan22_transformer picks the
same expert and returns the same velocity at every step.

Tensors of the file (float32; shapes for the tiny config below):
  transformer.<diffusers Wan name>     the high-noise expert's weights
  transformer_2.<diffusers Wan name>   the low-noise expert's weights
  prompt_embeds   [1, 8, 24]   5 random tokens then 3 zero rows (text_len 8: our model pads with zeros to it)
  boundary        [1]          boundary_ratio
  timesteps       [S]          the timestep of each step (1000 sigma)
  experts         [S]          0 = transformer (high noise), 1 = transformer_2 (low noise)
  inputs          [S, 1, 4, 2, 4, 4]   the latents each step's expert saw
  outputs         [S, 1, 4, 2, 4, 4]   its velocity

Run: /work/main/.venv/bin/python tests/reference/wan22_switch_reference.py  (diffusers 0.42, torch 2.x, CPU).
"""

import os

import torch
from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
from safetensors.torch import save_file

BOUNDARY = 0.6
STEPS = 6
TEXT_TOKENS = 5
TEXT_LEN = 8
# wan_config::tiny() with out_dim = in_dim (named_wan22_config("wan22-tiny")'s experts) and 1 block instead of 2, which
# keeps the file under 300 KB (the block stack itself is tests/torch/test_wan.cpp's).
TINY = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=20,
    in_channels=4,
    out_channels=4,
    text_dim=24,
    freq_dim=32,
    ffn_dim=56,
    num_layers=1,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
)


def random_expert(seed):
    """A tiny expert whose every weight matters: linears N(0, 0.2^2), norm weights 1 + N(0, 0.2^2), modulation
    tables N(0, 0.5^2) (as tests/torch/test_wan.cpp randomizes the native model)."""
    model = WanTransformer3DModel(**TINY).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            table = name.endswith("scale_shift_table")
            spread = 0.5 if table else 0.2
            noise = torch.randn(parameter.shape, generator=generator) * spread
            norm_weight = "norm" in name and name.endswith(".weight")
            parameter.copy_(noise + (1.0 if norm_weight else 0.0))
    return model


def main():
    torch.manual_seed(0)
    high, low = random_expert(1), random_expert(2)
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    pipe = WanPipeline(
        tokenizer=None,
        text_encoder=None,
        vae=None,
        scheduler=scheduler,
        transformer=high,
        transformer_2=low,
        boundary_ratio=BOUNDARY,
    )
    records = []

    def recorder(expert):
        def hook(_module, _args, kwargs, output):
            records.append(
                (
                    float(kwargs["timestep"].reshape(-1)[0]),
                    expert,
                    kwargs["hidden_states"].detach().clone(),
                    output[0].detach().clone(),
                )
            )

        return hook

    high.register_forward_hook(recorder(0), with_kwargs=True)
    low.register_forward_hook(recorder(1), with_kwargs=True)

    generator = torch.Generator().manual_seed(3)
    text = torch.randn(1, TEXT_TOKENS, TINY["text_dim"], generator=generator)
    prompt_embeds = torch.cat([text, torch.zeros(1, TEXT_LEN - TEXT_TOKENS, TINY["text_dim"])], dim=1)
    pipe(
        prompt_embeds=prompt_embeds,
        height=32,
        width=32,
        num_frames=5,  # (5 - 1) / 4 + 1 = 2 latent frames of 4 x 4
        num_inference_steps=STEPS,
        guidance_scale=1.0,
        output_type="latent",
        generator=torch.Generator().manual_seed(4),
    )
    assert len(records) == STEPS, len(records)
    experts = [r[1] for r in records]
    assert 0 in experts and 1 in experts, experts

    tensors = {f"transformer.{k}": v.contiguous() for k, v in high.state_dict().items()}
    tensors.update({f"transformer_2.{k}": v.contiguous() for k, v in low.state_dict().items()})
    tensors["prompt_embeds"] = prompt_embeds.contiguous()
    tensors["boundary"] = torch.tensor([BOUNDARY], dtype=torch.float32)
    tensors["timesteps"] = torch.tensor([r[0] for r in records], dtype=torch.float32)
    tensors["experts"] = torch.tensor(experts, dtype=torch.float32)
    tensors["inputs"] = torch.stack([r[2] for r in records]).float().contiguous()
    tensors["outputs"] = torch.stack([r[3] for r in records]).float().contiguous()
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "wan22_switch.safetensors")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    save_file(tensors, out, metadata={"generator": "tests/reference/wan22_switch_reference.py"})
    print(out, os.path.getsize(out), "bytes; timesteps", tensors["timesteps"].tolist(), "experts", experts)


if __name__ == "__main__":
    main()
