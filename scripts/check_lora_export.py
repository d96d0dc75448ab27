#!/usr/bin/env python3
"""Checks `branchgrpo export-lora`'s files against diffusers.

Modes:
  keys --modules MODULES DIR
      Standard library only (the ctest cli_export_lora_keys). DIR is test_lora_export's fixture directory with
      DIR/exported/ written by tests/torch/export_lora_all.sh. Every diffusers-format key must name a linear module
      of diffusers' tiny FluxTransformer2DModel / WanTransformer3DModel / SD3Transformer2DModel (MODULES: "family
      module out in" lines, as `modules` writes them) with lora_A [rank, in] and lora_B [out, rank], and every linear
      module must be covered (the fixture adapts every layer); the kohya and comfyui files must name the same layers
      as each other, and a merged file must hold the base's tensors with their shapes. Wan2.2 exports a file per
      expert (wan22_diffusers.high_noise_model.safetensors, ...: family "wan22", Wan's modules of the expert's
      shape), each naming its expert in its metadata, and no file without the expert.
  modules MODULES
      Needs diffusers (PyTorch 2): writes MODULES from diffusers' own tiny models (tests/torch/
      lora_export_diffusers_modules.txt is this output).
  verify DIR
      Needs diffusers (PyTorch 2): builds the tiny diffusers models, loads the C++ side's base weights (bfl /
      official / Stability names; Wan and SD3 converted by diffusers' single-file converters, FLUX by
      bfl_to_diffusers of the package's python/branchgrpo/flux.py), loads each exported LoRA as
      pipe.load_lora_weights does (Pipeline.lora_state_dict + load_lora_into_transformer; Wan2.2's through
      WanPipeline(transformer=high, transformer_2=low).load_lora_weights, the low-noise file with
      load_into_transformer_2=True) and the merged files, and compares diffusers' output with the C++ model's
      velocity on the same inputs (DIR/flux/io.safetensors, DIR/wan/io.safetensors, DIR/sd3/io.safetensors,
      DIR/wan22/io.<expert>.safetensors). diffusers reads no SD3 kohya or comfyui LoRA: those are merged into the
      Stability weights as ComfyUI applies a LoRA (W + alpha / rank up down; comfyui's B holds the scale), then
      converted and run likewise. Prints the relative error max|diff| / max|velocity| of each; fails above 1e-4.

The tiny shapes are those of the run configs "tiny" (flux_config::tiny()), "wan-tiny" (wan_config::tiny() with
out_dim = in_dim = 4, model_specs/wan/spec.hpp's named_wan_config), "sd3-tiny" (sd3_config::tiny() with 3 channels
and prompts 32 wide, model_specs/sd3/spec.hpp's named_sd3_config) and "wan22-tiny" (two wan_config::tiny() experts
with 3 channels and text 32 wide, model_specs/wan22/spec.hpp's named_wan22_config).
"""
import json
import struct
import sys
from pathlib import Path

TOLERANCE = 1e-4
FLUX_TINY = dict(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=32,
                 num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16, guidance_embeds=True,
                 axes_dims_rope=(8, 12, 12))
WAN_TINY = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=20, in_channels=4, out_channels=4,
                text_dim=24, freq_dim=32, ffn_dim=56, num_layers=2, cross_attn_norm=True,
                qk_norm="rms_norm_across_heads", eps=1e-6)
WAN_TEXT_LEN = 8
SD3_TINY = dict(sample_size=16, patch_size=2, in_channels=3, num_layers=2, attention_head_dim=10, num_attention_heads=2,
                joint_attention_dim=32, caption_projection_dim=20, pooled_projection_dim=32, out_channels=3,
                pos_embed_max_size=8, dual_attention_layers=(0,), qk_norm="rms_norm")
WAN22_TINY = dict(WAN_TINY, in_channels=3, out_channels=3, text_dim=32)  # each expert
WAN22_EXPERTS = ("high_noise_model", "low_noise_model")  # lora.<expert>.safetensors; WanPipeline transformer(_2)


def header(path):
    """The tensors' {name: shape} and the metadata of a safetensors file (its JSON header only)."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        entries = json.loads(f.read(size))
    metadata = entries.pop("__metadata__", {})
    return {name: entry["shape"] for name, entry in entries.items()}, metadata


def fail(message):
    print("check_lora_export.py: FAILED: " + message, file=sys.stderr)
    sys.exit(1)


def check_diffusers_keys(path, modules):
    shapes, metadata = header(path)
    covered = set()
    for name, shape in shapes.items():
        if not name.startswith("transformer.") or not name.endswith((".lora_A.weight", ".lora_B.weight")):
            fail(f"{path.name}: {name} is not a diffusers LoRA key")
        module = name[len("transformer."):-len(".lora_A.weight")]
        if module not in modules:
            fail(f"{path.name}: {module} is not a linear module of diffusers' model")
        out_features, in_features = modules[module]
        rank = int(metadata["branchgrpo.rank"])
        want = [rank, in_features] if name.endswith(".lora_A.weight") else [out_features, rank]
        if shape != want:
            fail(f"{path.name}: {name} is {shape}, diffusers' {module} needs {want}")
        covered.add(module)
    missing = sorted(set(modules) - covered)
    if missing:
        fail(f"{path.name}: no adapter for {len(missing)} linear modules of diffusers', e.g. {missing[:3]}")
    print(f"ok {path.name}: {len(shapes)} tensors on all {len(modules)} linear modules of diffusers' model")


def layers_of(shapes, prefix, suffixes):
    out = set()
    for name in shapes:
        for suffix in suffixes:
            if name.startswith(prefix) and name.endswith(suffix):
                out.add(name[len(prefix):-len(suffix)])
    return out


def comfyui_layers(path):
    shapes, _ = header(path)
    layers = layers_of(shapes, "diffusion_model.", [".lora_A.weight", ".lora_B.weight"])
    if len(shapes) != 2 * len(layers):
        fail(f"{path.name}: a layer lacks lora_A or lora_B, or a key is not diffusion_model.<layer>.lora_A/B.weight")
    return layers


def check_kohya_comfyui(out, family):
    kohya, _ = header(out / f"{family}_kohya.safetensors")
    kohya_layers = layers_of(kohya, "lora_unet_", [".lora_down.weight", ".lora_up.weight", ".alpha"])
    comfy_layers = {name.replace(".", "_") for name in comfyui_layers(out / f"{family}_comfyui.safetensors")}
    if len(kohya) != 3 * len(kohya_layers) or kohya_layers != comfy_layers:
        fail(f"{family}_kohya / {family}_comfyui: the layers differ or a kohya layer lacks lora_down, lora_up or alpha")
    print(f"ok {family}_kohya, {family}_comfyui: the same {len(kohya_layers)} layers")


def check_wan22_files(out, modules):
    """Wan2.2's export: a file per expert in Wan's keys, each naming its expert, none without the expert."""
    for stem in ["wan22_diffusers", "wan22_comfyui"]:
        if (out / f"{stem}.safetensors").exists():
            fail(f"{stem}.safetensors: Wan2.2 exports a file per expert, not one file")
    wan_layers = comfyui_layers(out / "wan_comfyui.safetensors")
    for expert in WAN22_EXPERTS:
        for stem in ["wan22_diffusers", "wan22_comfyui"]:
            _, metadata = header(out / f"{stem}.{expert}.safetensors")
            if metadata.get("branchgrpo.module") != expert or metadata.get("branchgrpo.family") != "Wan2.2":
                fail(f"{stem}.{expert}.safetensors: metadata names module {metadata.get('branchgrpo.module')!r}, "
                     f"family {metadata.get('branchgrpo.family')!r}")
        check_diffusers_keys(out / f"wan22_diffusers.{expert}.safetensors", modules)
        # The same architecture as Wan's fixture, every layer adapted: the same official layers.
        if comfyui_layers(out / f"wan22_comfyui.{expert}.safetensors") != wan_layers:
            fail(f"wan22_comfyui.{expert}: its layers are not Wan's official ones (wan_comfyui's)")
        print(f"ok wan22_comfyui.{expert}: Wan's {len(wan_layers)} official layers")


def keys_mode(modules_file, fixture):
    modules = {"flux": {}, "wan": {}, "sd3": {}, "wan22": {}}
    for line in Path(modules_file).read_text().splitlines():
        if line and not line.startswith("#"):
            family, module, out_features, in_features = line.split()
            modules[family][module] = (int(out_features), int(in_features))
    out = Path(fixture) / "exported"
    check_diffusers_keys(out / "flux_diffusers.safetensors", modules["flux"])
    check_diffusers_keys(out / "flux_diffusers_ema_bf16.safetensors", modules["flux"])
    check_diffusers_keys(out / "wan_diffusers.safetensors", modules["wan"])
    check_diffusers_keys(out / "sd3_diffusers.safetensors", modules["sd3"])
    check_kohya_comfyui(out, "flux")
    check_kohya_comfyui(out, "sd3")
    check_wan22_files(out, modules["wan22"])
    for merged, base in [("flux_merged", "flux"), ("wan_merged", "wan"), ("flux_full_merged", "flux"),
                         ("sd3_merged", "sd3"), ("wan22_merged", "wan22")]:
        got, _ = header(out / f"{merged}.safetensors")
        want, _ = header(Path(fixture) / base / "base.safetensors")
        if got != want:
            fail(f"{merged}: tensors differ from {base}/base.safetensors")
        print(f"ok {merged}: the {len(got)} tensors of the base model")
    print("check_lora_export.py keys: all checks passed")


# ---- diffusers (PyTorch 2) ----------------------------------------------------------------------------------

def tiny_model(kind):
    """diffusers' tiny transformer of `kind`: flux, wan, sd3 or wan22 (one expert)."""
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel, WanTransformer3DModel
    if kind == "flux":
        return FluxTransformer2DModel(**FLUX_TINY)
    if kind == "sd3":
        return SD3Transformer2DModel(**SD3_TINY)
    return WanTransformer3DModel(**(WAN_TINY if kind == "wan" else WAN22_TINY))


def modules_mode(path):
    import torch
    lines = ["# family module out_features in_features: the nn.Linear modules of diffusers' tiny models",
             "# (scripts/check_lora_export.py modules; regenerate when diffusers renames a module)"]
    for family in ["flux", "wan", "sd3", "wan22"]:
        model = tiny_model(family)
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear):
                lines.append(f"{family} {name} {module.out_features} {module.in_features}")
    Path(path).write_text("\n".join(lines) + "\n")
    print(f"wrote {path}: {len(lines) - 2} modules")


def flux_bfl_to_diffusers(bfl, hidden=64):
    """BFL -> diffusers FLUX names: the Python package's bfl_to_diffusers (python/branchgrpo/flux.py), written from
    the layout (docs/flux.md "Weight layouts"), independent of the C++ conversion; diffusers' own single-file
    converter fixes the width at FLUX.1's 3072. The module is loaded from the repository's python/ folder by its
    path: the package's __init__ needs the built extension, flux.py needs torch and safetensors only."""
    import importlib.util
    path = Path(__file__).resolve().parents[1] / "python" / "branchgrpo" / "flux.py"
    spec = importlib.util.spec_from_file_location("branchgrpo_flux", path)
    flux = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(flux)
    return flux.bfl_to_diffusers(bfl, hidden)


def relative_error(got, want):
    return float((got.double() - want.double()).abs().max() / want.double().abs().max())


def verify_mode(fixture):
    import diffusers
    import torch
    from diffusers import FluxPipeline, StableDiffusion3Pipeline, WanPipeline
    from diffusers.loaders import single_file_utils as single_file
    from safetensors.torch import load_file

    torch.manual_seed(0)
    fixture = Path(fixture)
    out = fixture / "exported"
    print(f"torch {torch.__version__}, diffusers {diffusers.__version__}")
    worst = 0.0

    def report(what, error):
        nonlocal worst
        worst = max(worst, error)
        print(f"{'ok' if error < TOLERANCE else 'FAILED'} {what}: relative error {error:.2e}")

    converters = {"flux": flux_bfl_to_diffusers, "wan": single_file.convert_wan_transformer_to_diffusers,
                  "sd3": single_file.convert_sd3_transformer_checkpoint_to_diffusers,
                  "wan22": single_file.convert_wan_transformer_to_diffusers}

    def fresh(kind, base):
        model = tiny_model(kind)
        model.load_state_dict(converters[kind](dict(base)), strict=True)
        return model.eval()

    def with_lora(kind, base, path, drop=lambda key: False):
        model = fresh(kind, base)
        pipeline = {"flux": FluxPipeline, "wan": WanPipeline, "sd3": StableDiffusion3Pipeline}[kind]
        lora = {key: tensor for key, tensor in load_file(path).items() if not drop(key)}
        if kind == "flux":
            state, alphas = pipeline.lora_state_dict(lora, return_alphas=True)
            pipeline.load_lora_into_transformer(state, network_alphas=alphas, transformer=model, adapter_name="x")
        else:
            pipeline.load_lora_into_transformer(pipeline.lora_state_dict(lora), transformer=model, adapter_name="x")
        return model

    # FLUX: token-level inputs, as FluxTransformer2DModel takes them.
    io = load_file(fixture / "flux" / "io.safetensors")
    base = load_file(fixture / "flux" / "base.safetensors")

    def flux_velocity(model):
        with torch.no_grad():
            return model(hidden_states=io["img"], encoder_hidden_states=io["txt"], pooled_projections=io["pooled"],
                         timestep=io["timesteps"], img_ids=io["img_ids"], txt_ids=io["txt_ids"],
                         guidance=io["guidance"], return_dict=False)[0]

    plain = relative_error(flux_velocity(fresh("flux", base)), io["velocity"])
    print(f"info flux without the LoRA differs from the C++ adapted model by {plain:.2e} (the LoRA matters)")
    report("flux_diffusers in diffusers vs C++",
           relative_error(flux_velocity(with_lora("flux", base, out / "flux_diffusers.safetensors")), io["velocity"]))
    # diffusers' kohya converter reads the blocks only (its top-level names miss the "transformer." prefix or are
    # dropped), and splits single blocks' linear1 at FLUX.1's widths (3 x 3072 + 12288), which a tiny model does
    # not have: restricted to the other block layers, the kohya file must load as the diffusers file does.
    kohya = flux_velocity(with_lora("flux", base, out / "flux_kohya.safetensors", lambda key: not key.startswith(
        ("lora_unet_double_blocks_", "lora_unet_single_blocks_")) or "_linear1." in key))
    same = flux_velocity(with_lora("flux", base, out / "flux_diffusers.safetensors", lambda key: not key.startswith(
        ("transformer.transformer_blocks.", "transformer.single_transformer_blocks.")) or (
        key.startswith("transformer.single_transformer_blocks.") and (".attn.to_" in key or ".proj_mlp." in key))))
    effect = relative_error(same, flux_velocity(fresh("flux", base)))
    print(f"info those block layers change diffusers' output by {effect:.2e}")
    if effect < 1e-3:
        fail("the kohya comparison adapted nothing")
    report("flux_kohya (block layers but linear1) vs flux_diffusers likewise, both in diffusers",
           relative_error(kohya, same))
    merged = load_file(out / "flux_merged.safetensors")
    report("flux_merged in diffusers vs C++", relative_error(flux_velocity(fresh("flux", merged)), io["velocity"]))

    # Wan: the text zero-padded to text_len, as the official code and diffusers' pipeline pad it.
    io = load_file(fixture / "wan" / "io.safetensors")
    base = load_file(fixture / "wan" / "base.safetensors")
    text = torch.nn.functional.pad(io["text"], (0, 0, 0, WAN_TEXT_LEN - io["text"].shape[1]))

    def wan_velocity(model):
        with torch.no_grad():
            return model(hidden_states=io["latents"], timestep=io["timestep"], encoder_hidden_states=text,
                         return_dict=False)[0]

    plain = relative_error(wan_velocity(fresh("wan", base)), io["velocity"])
    print(f"info wan without the LoRA differs from the C++ adapted model by {plain:.2e} (the LoRA matters)")
    for name in ["wan_diffusers", "wan_comfyui"]:
        adapted = with_lora("wan", base, out / f"{name}.safetensors")
        report(f"{name} in diffusers vs C++", relative_error(wan_velocity(adapted), io["velocity"]))
    merged = load_file(out / "wan_merged.safetensors")
    report("wan_merged in diffusers vs C++", relative_error(wan_velocity(fresh("wan", merged)), io["velocity"]))

    # SD3: latents [B, C, H, W], the timestep 1000 sigma, as SD3Transformer2DModel takes them.
    io = load_file(fixture / "sd3" / "io.safetensors")
    base = load_file(fixture / "sd3" / "base.safetensors")

    def sd3_velocity(model):
        with torch.no_grad():
            return model(hidden_states=io["latents"], encoder_hidden_states=io["context"],
                         pooled_projections=io["pooled"], timestep=io["timestep"], return_dict=False)[0]

    plain = relative_error(sd3_velocity(fresh("sd3", base)), io["velocity"])
    print(f"info sd3 without the LoRA differs from the C++ adapted model by {plain:.2e} (the LoRA matters)")
    report("sd3_diffusers in diffusers vs C++",
           relative_error(sd3_velocity(with_lora("sd3", base, out / "sd3_diffusers.safetensors")), io["velocity"]))

    # kohya's flat names back to Stability's: the layers of the base weights with their dots as underscores.
    stability_of = {name[:-len(".weight")].replace(".", "_"): name[:-len(".weight")] for name in base}

    def comfyui_merge(base, lora, kohya):
        """`base` (Stability names) with each layer's W + scale up down, as ComfyUI applies a LoRA file: kohya's
        scale is alpha / rank, comfyui's B holds it (scale 1)."""
        merged = {name: tensor.double() for name, tensor in base.items()}
        for key, down in lora.items():
            if key.endswith(".lora_down.weight" if kohya else ".lora_A.weight"):
                layer = key[:-len(".lora_down.weight" if kohya else ".lora_A.weight")]
                up = lora[layer + (".lora_up.weight" if kohya else ".lora_B.weight")]
                scale = float(lora[layer + ".alpha"]) / down.shape[0] if kohya else 1.0
                module = stability_of[layer[len("lora_unet_"):]] if kohya else layer[len("diffusion_model."):]
                merged[module + ".weight"] += scale * up.double() @ down.double()
        return {name: tensor.float() for name, tensor in merged.items()}

    for name, kohya in [("sd3_kohya", True), ("sd3_comfyui", False)]:
        merged = comfyui_merge(base, load_file(out / f"{name}.safetensors"), kohya)
        report(f"{name} applied to the Stability weights, in diffusers vs C++",
               relative_error(sd3_velocity(fresh("sd3", merged)), io["velocity"]))
    merged = load_file(out / "sd3_merged.safetensors")
    report("sd3_merged in diffusers vs C++", relative_error(sd3_velocity(fresh("sd3", merged)), io["velocity"]))

    # Wan2.2: each expert is a Wan transformer of WanPipeline (high noise: transformer, low noise: transformer_2);
    # each expert's file loads as a user loads it, pipe.load_lora_weights(file[, load_into_transformer_2=True]).
    base = load_file(fixture / "wan22" / "base.safetensors")
    experts = {expert: {name[len(expert) + 1:]: tensor for name, tensor in base.items()
                        if name.startswith(expert + ".")} for expert in WAN22_EXPERTS}
    merged = load_file(out / "wan22_merged.safetensors")
    merged = {expert: {name[len(expert) + 1:]: tensor for name, tensor in merged.items()
                       if name.startswith(expert + ".")} for expert in WAN22_EXPERTS}
    ios = {expert: load_file(fixture / "wan22" / f"io.{expert}.safetensors") for expert in WAN22_EXPERTS}

    def wan22_velocity(model, expert):
        io = ios[expert]
        text = torch.nn.functional.pad(io["text"], (0, 0, 0, WAN_TEXT_LEN - io["text"].shape[1]))
        with torch.no_grad():
            return model(hidden_states=io["latents"], timestep=io["timestep"], encoder_hidden_states=text,
                         return_dict=False)[0]

    for expert in WAN22_EXPERTS:
        plain = relative_error(wan22_velocity(fresh("wan22", experts[expert]), expert), ios[expert]["velocity"])
        print(f"info wan22 {expert} without the LoRA differs from the C++ adapted model by {plain:.2e}")
    for name in ["wan22_diffusers", "wan22_comfyui"]:
        pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=None,
                           transformer=fresh("wan22", experts["high_noise_model"]),
                           transformer_2=fresh("wan22", experts["low_noise_model"]), boundary_ratio=0.875)
        pipe.load_lora_weights(str(out / f"{name}.high_noise_model.safetensors"), adapter_name="x")
        pipe.load_lora_weights(str(out / f"{name}.low_noise_model.safetensors"), adapter_name="x",
                               load_into_transformer_2=True)
        for expert, model in [("high_noise_model", pipe.transformer), ("low_noise_model", pipe.transformer_2)]:
            report(f"{name}.{expert} in diffusers' WanPipeline vs C++ (timesteps {ios[expert]['timestep'].tolist()})",
                   relative_error(wan22_velocity(model, expert), ios[expert]["velocity"]))
    for expert in WAN22_EXPERTS:
        report(f"wan22_merged {expert} in diffusers vs C++",
               relative_error(wan22_velocity(fresh("wan22", merged[expert]), expert), ios[expert]["velocity"]))

    # --ema: the fixture's EMA is half the trained factors, so each exported B is half (A too: 0.5 A, 0.5 B).
    trained = load_file(out / "flux_diffusers.safetensors")
    ema = load_file(out / "flux_diffusers_ema_bf16.safetensors")
    error = max(relative_error(ema[k].float(), 0.5 * trained[k]) for k in trained)
    print(f"{'ok' if error < 1e-2 else 'FAILED'} flux_diffusers_ema_bf16: 0.5 x the trained factors within bf16 "
          f"rounding ({error:.2e}), dtype {next(iter(ema.values())).dtype}")
    if worst >= TOLERANCE or error >= 1e-2:
        fail(f"worst relative error {worst:.2e} (tolerance {TOLERANCE})")
    print(f"check_lora_export.py verify: all passed, worst relative error {worst:.2e}")


def main(argv):
    if len(argv) == 4 and argv[0] == "keys" and argv[1] == "--modules":
        keys_mode(argv[2], argv[3])
    elif len(argv) == 2 and argv[0] == "modules":
        modules_mode(argv[1])
    elif len(argv) == 2 and argv[0] == "verify":
        verify_mode(argv[1])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
