"""FLUX model directories (the C++ tool's ``model.dir``, e.g. ``models/shapes-tiny``) in diffusers, and the
velocity the C++ FLUX denoiser computes, for ``branchgrpo.rollout`` (docs/python.md, "Equality with the C++ tool").

A model directory holds ``model.safetensors`` (the BFL layout, its ``flux_config`` in the metadata key
``branchgrpo.flux_config``) and ``prompts.safetensors`` (``context`` [N, L, D], ``pooled`` [N, V], the prompt strings
in the metadata key ``prompts``, one per line). ``load_model`` builds diffusers' ``FluxTransformer2DModel`` from them
(diffusers is imported there, so this module imports without it); ``velocity`` is the C++ denoiser's
(adapters/torch/branchgrpo/torch/flux/denoiser.hpp): latent rows [C, H, W] packed 2 x 2 into tokens, image ids
(0, row, col), text ids 0, time sigma (embedded as 1000 sigma), prompt index p selecting row p of the embeddings.
The packing, ids and transformer call are ``branchgrpo.diffusers.flux``'s, which FLUX pipelines use too.

>>> model = load_model("models/shapes-tiny")
>>> prompts = load_prompts("models/shapes-tiny")
>>> v = velocity(model, prompts)(torch.zeros(2, 3, 16, 16), 1.0, 0, torch.tensor([0, 4]), torch.tensor([0, 1]))
>>> tuple(v.shape), prompts.texts[4]
((2, 3, 16, 16), 'a green square')
"""

from __future__ import annotations

import contextlib
import json
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from safetensors.torch import load_file

from branchgrpo.diffusers.flux import transformer_velocity

if TYPE_CHECKING:
    from diffusers import FluxTransformer2DModel

__all__ = [
    "Prompts",
    "bfl_to_diffusers",
    "diffusers_config",
    "load_model",
    "load_prompts",
    "parse_config",
    "read_config",
    "velocity",
]

CONFIG_KEY = "branchgrpo.flux_config"


def _flag(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError(text)
    return text == "1"


def _axes(text: str) -> tuple[int, ...]:
    axes = tuple(int(a) for a in text.split(","))
    if len(axes) != 3:
        raise ValueError(text)
    return axes


# flux_config's keys in the C++ order (model_specs/flux/config.hpp, format_flux_config), each with its reader and
# what the reader takes.
_INTEGER, _NUMBER = (int, "an integer"), (float, "a number")
_FIELDS: dict[str, tuple[Callable[[str], Any], str]] = {
    **dict.fromkeys(("in_channels", "hidden", "heads", "depth_double", "depth_single"), _INTEGER),
    "rope_axes": (_axes, "three integers"),
    "rope_theta": _NUMBER,
    **dict.fromkeys(("vec_in", "context_in"), _INTEGER),
    "mlp_ratio": _NUMBER,
    **dict.fromkeys(("qkv_bias", "guidance_embed"), (_flag, "0 or 1")),
}


def _metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file (its JSON header only)."""
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(size)).get("__metadata__", {})


def read_config(directory: str | Path) -> dict[str, Any]:
    """The model's ``flux_config`` (DIR/model.safetensors' metadata ``branchgrpo.flux_config``, "key=value;..."),
    typed: integers, floats, ``rope_axes`` a tuple, ``qkv_bias`` and ``guidance_embed`` booleans.

    >>> c = read_config("models/shapes-tiny")
    >>> c["hidden"], c["rope_axes"], c["guidance_embed"]
    (64, (8, 12, 12), False)
    >>> read_config("models/none")
    Traceback (most recent call last):
    ValueError: models/none/model.safetensors: no such file
    """
    path = Path(directory) / "model.safetensors"
    text = _metadata(path).get(CONFIG_KEY)
    if text is None:
        raise ValueError(f"{path}: no __metadata__ key '{CONFIG_KEY}'")
    return parse_config(text, str(path))


def parse_config(text: str, source: str) -> dict[str, Any]:
    """A ``flux_config`` text "key=value;..." (format_flux_config's: every key once), typed as ``read_config``;
    ``source`` starts the one-line ``ValueError`` naming a bad key or value.

    >>> parse_config("hidden=x", "m")
    Traceback (most recent call last):
    ValueError: m: flux_config = 'hidden=x': must hold each of in_channels, hidden, ... once
    >>> text = "in_channels=12;hidden=6.4;heads=2;depth_double=2;depth_single=2;rope_axes=8,12,12;rope_theta=10000;"
    >>> parse_config(text + "vec_in=32;context_in=32;mlp_ratio=4;qkv_bias=1;guidance_embed=0", "m")
    Traceback (most recent call last):
    ValueError: m: flux_config hidden = '6.4': must be an integer
    """
    fields = dict(item.partition("=")[::2] for item in text.split(";"))
    if sorted(fields) != sorted(_FIELDS) or text.count(";") != len(_FIELDS) - 1:
        raise ValueError(f"{source}: flux_config = {text!r}: must hold each of {', '.join(_FIELDS)} once")
    out = {}
    for key, (read, kind) in _FIELDS.items():
        try:
            out[key] = read(fields[key])
        except ValueError:
            raise ValueError(f"{source}: flux_config {key} = {fields[key]!r}: must be {kind}") from None
    return out


def diffusers_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``FluxTransformer2DModel``'s arguments for a ``read_config`` config. diffusers fixes RoPE's theta at 10000,
    the MLP ratio at 4 and biases on q, k, v: a config with others raises ``ValueError`` naming the key.

    >>> diffusers_config(read_config("models/shapes-tiny"))["attention_head_dim"]
    32
    >>> diffusers_config({**read_config("models/shapes-tiny"), "mlp_ratio": 2.0})
    Traceback (most recent call last):
    ValueError: flux_config mlp_ratio = 2.0: diffusers' FluxTransformer2DModel has 4.0
    """
    for key, fixed in (("rope_theta", 10000.0), ("mlp_ratio", 4.0), ("qkv_bias", True)):
        if config[key] != fixed:
            raise ValueError(f"flux_config {key} = {config[key]}: diffusers' FluxTransformer2DModel has {fixed}")
    return dict(
        patch_size=1,
        in_channels=config["in_channels"],
        num_layers=config["depth_double"],
        num_single_layers=config["depth_single"],
        attention_head_dim=config["hidden"] // config["heads"],
        num_attention_heads=config["heads"],
        joint_attention_dim=config["context_in"],
        pooled_projection_dim=config["vec_in"],
        guidance_embeds=config["guidance_embed"],
        axes_dims_rope=config["rope_axes"],
    )


def bfl_to_diffusers(bfl: Mapping[str, torch.Tensor], hidden: int) -> dict[str, torch.Tensor]:
    """BFL -> diffusers FLUX tensor names (docs/flux.md "Weight layouts"), for a transformer of width ``hidden``:
    fused q, k, v split, the final layer's (shift, scale) swapped to diffusers' (scale, shift). Written from the
    layout, independent of the C++ conversion; diffusers' own single-file converter fixes the width at FLUX.1's 3072.

    >>> state = bfl_to_diffusers(load_file("models/shapes-tiny/model.safetensors"), 64)
    >>> len(state), tuple(state["transformer_blocks.0.attn.to_q.weight"].shape)
    (108, (64, 64))
    """
    out: dict[str, torch.Tensor] = {}

    def put(target: str, source: str) -> None:
        for suffix in (".weight", ".bias"):
            if source + suffix in bfl:
                out[target + suffix] = bfl[source + suffix]

    def split(targets: list[str], source: str, rows: int | list[int]) -> None:
        for suffix in (".weight", ".bias"):
            if source + suffix in bfl:
                for target, part in zip(targets, torch.split(bfl[source + suffix], rows), strict=True):
                    out[target + suffix] = part

    top = {
        "x_embedder": "img_in",
        "time_text_embed.timestep_embedder.linear_1": "time_in.in_layer",
        "time_text_embed.timestep_embedder.linear_2": "time_in.out_layer",
        "time_text_embed.text_embedder.linear_1": "vector_in.in_layer",
        "time_text_embed.text_embedder.linear_2": "vector_in.out_layer",
        "time_text_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
        "time_text_embed.guidance_embedder.linear_2": "guidance_in.out_layer",
        "context_embedder": "txt_in",
        "proj_out": "final_layer.linear",
    }
    for target, source in top.items():
        put(target, source)
    for suffix in (".weight", ".bias"):
        shift, scale = bfl["final_layer.adaLN_modulation.1" + suffix].chunk(2)
        out["norm_out.linear" + suffix] = torch.cat([scale, shift])
    for i in sorted({int(k.split(".")[1]) for k in bfl if k.startswith("double_blocks.")}):
        p, q = f"double_blocks.{i}.", f"transformer_blocks.{i}."
        put(q + "norm1.linear", p + "img_mod.lin")
        put(q + "norm1_context.linear", p + "txt_mod.lin")
        split([q + "attn.to_q", q + "attn.to_k", q + "attn.to_v"], p + "img_attn.qkv", hidden)
        split([q + "attn.add_q_proj", q + "attn.add_k_proj", q + "attn.add_v_proj"], p + "txt_attn.qkv", hidden)
        for stream, norms in (("img", ("norm_q", "norm_k")), ("txt", ("norm_added_q", "norm_added_k"))):
            out[q + f"attn.{norms[0]}.weight"] = bfl[p + f"{stream}_attn.norm.query_norm.scale"]
            out[q + f"attn.{norms[1]}.weight"] = bfl[p + f"{stream}_attn.norm.key_norm.scale"]
        put(q + "attn.to_out.0", p + "img_attn.proj")
        put(q + "attn.to_add_out", p + "txt_attn.proj")
        put(q + "ff.net.0.proj", p + "img_mlp.0")
        put(q + "ff.net.2", p + "img_mlp.2")
        put(q + "ff_context.net.0.proj", p + "txt_mlp.0")
        put(q + "ff_context.net.2", p + "txt_mlp.2")
    for i in sorted({int(k.split(".")[1]) for k in bfl if k.startswith("single_blocks.")}):
        p, q = f"single_blocks.{i}.", f"single_transformer_blocks.{i}."
        rows = bfl[p + "linear1.weight"].shape[0]
        qkv_mlp = [q + "attn.to_q", q + "attn.to_k", q + "attn.to_v", q + "proj_mlp"]
        split(qkv_mlp, p + "linear1", [hidden, hidden, hidden, rows - 3 * hidden])
        put(q + "proj_out", p + "linear2")
        put(q + "norm.linear", p + "modulation.lin")
        out[q + "attn.norm_q.weight"] = bfl[p + "norm.query_norm.scale"]
        out[q + "attn.norm_k.weight"] = bfl[p + "norm.key_norm.scale"]
    return out


def load_model(
    directory: str | Path, *, dtype: torch.dtype = torch.float32, device: Any = "cpu"
) -> FluxTransformer2DModel:
    """diffusers' ``FluxTransformer2DModel`` of a model directory: its config from the metadata (``read_config``,
    ``diffusers_config``), its BFL weights renamed (``bfl_to_diffusers``) and loaded strictly, in evaluation mode
    on ``device`` in ``dtype``. Needs diffusers (python/requirements.txt pins it).

    >>> model = load_model("models/shapes-tiny")
    >>> type(model).__name__, model.config.num_layers, model.dtype
    ('FluxTransformer2DModel', 2, torch.float32)
    """
    from diffusers import FluxTransformer2DModel

    config = read_config(directory)
    model = FluxTransformer2DModel(**diffusers_config(config))
    bfl = load_file(str(Path(directory) / "model.safetensors"))
    model.load_state_dict(bfl_to_diffusers(bfl, config["hidden"]), strict=True)
    if dtype != torch.float32:  # diffusers warns about any dtype given to to(), even its own
        model = model.to(dtype=dtype)
    return model.to(device=device).eval()


class Prompts(NamedTuple):
    """A model directory's prompt table: ``context`` [N, L, D] and ``pooled`` [N, V] (float32), ``texts`` the N
    prompt strings; prompt index p is row p."""

    context: torch.Tensor
    pooled: torch.Tensor
    texts: list[str]


def load_prompts(directory: str | Path) -> Prompts:
    """DIR/prompts.safetensors as ``Prompts`` (float32 on the CPU).

    >>> p = load_prompts("models/shapes-tiny")
    >>> tuple(p.context.shape), tuple(p.pooled.shape), p.texts[:2]
    ((12, 3, 32), (12, 32), ['a red circle', 'a red square'])
    """
    path = Path(directory) / "prompts.safetensors"
    texts = _metadata(path).get("prompts")
    if texts is None:
        raise ValueError(f"{path}: no __metadata__ key 'prompts' (the prompt strings)")
    tensors = load_file(str(path))
    if "pooled" not in tensors:
        raise ValueError(f"{path}: no tensor 'pooled' (FLUX needs the pooled vectors)")
    context, pooled, lines = tensors["context"].float(), tensors["pooled"].float(), texts.split("\n")
    if not len(lines) == context.shape[0] == pooled.shape[0]:
        raise ValueError(
            f"{path}: {len(lines)} prompt strings, {context.shape[0]} context and {pooled.shape[0]} pooled rows"
        )
    return Prompts(context, pooled, lines)


def velocity(
    model: FluxTransformer2DModel, prompts: Prompts, *, guidance: float = 3.5, gradients: bool = False
) -> Callable[..., torch.Tensor]:
    """The C++ FLUX denoiser's velocity as ``branchgrpo.rollout`` calls it: ``v(latents, sigma, step, prompts, trees)``
    for rows [C, H, W] (odd H or W zero-padded at the bottom / right and cropped back), conditioned on each row's
    prompt's context and pooled rows, at time sigma, with the embedded ``guidance`` when the model has a guidance
    embedding (the run config's model.guidance); computed on the model's device and dtype and returned like
    ``latents``, without gradients unless ``gradients`` (then under the caller's grad mode: an update's policy).

    >>> model, table = load_model("models/shapes-tiny"), load_prompts("models/shapes-tiny")
    >>> x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    >>> v = velocity(model, table)
    >>> one, each = v(x, 0.5, 0, torch.tensor([1, 1, 7]), None), v(x[2:], 0.5, 0, torch.tensor([7]), None)
    >>> tuple(one.shape), bool((one[2] - each[0]).abs().max() < 1e-5), one.requires_grad
    ((3, 3, 16, 16), True, False)
    >>> velocity(model, table, gradients=True)(x, 0.5, 0, torch.tensor([1, 1, 7]), None).requires_grad
    True
    >>> v(x[:, :2], 0.5, 0, torch.tensor([1, 1, 7]), None)
    Traceback (most recent call last):
    ValueError: velocity: latents (3, 2, 16, 16): must be [rows, 3, H, W]
    """

    def call(latents: torch.Tensor, sigma: float, step: int, rows: torch.Tensor, trees: Any) -> torch.Tensor:
        index = torch.as_tensor(rows, dtype=torch.int64).cpu()
        txt_ids = torch.zeros(prompts.context.shape[1], 3, dtype=torch.float64)
        guided = guidance if model.config.guidance_embeds else None
        with contextlib.nullcontext() if gradients else torch.no_grad():
            out = transformer_velocity(
                model, latents, sigma, prompts.context[index], prompts.pooled[index], txt_ids, guided
            )
        return out.to(latents.device, latents.dtype)

    return call
