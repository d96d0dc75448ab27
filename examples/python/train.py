"""Train a diffusers model with branchgrpo: LoRA (peft) or full fine-tuning of FLUX.1, FLUX.2, SD3 / SD3.5, Wan2.1,
Wan2.2 (A14B's two experts, TI2V-5B) or Qwen-Image.

One file, top to bottom: arguments, processes, the pipeline, the prompts, the reward, the trainable weights (DDP or
FSDP2), the held-out evaluation, the checkpoints, the Trainer, the loop with its logs, the final LoRA in diffusers'
format (docs/python.md, "Training a diffusers model").

    python examples/python/train.py --model flux --tiny --prompts prompts.txt --reward my_reward:score --output out
    torchrun --nproc_per_node 8 examples/python/train.py --model flux --pretrained /models/FLUX.1-dev \\
        --prompts prompts.jsonl --reward-server http://127.0.0.1:8000 --dtype bfloat16 --output out
    accelerate launch --num_processes 8 examples/python/train.py ...   (the same arguments)

The reward is ``--reward module:function``, called as ``function(images, prompts)`` with the leaves decoded by the
pipeline's VAE (float32 RGB in [-1, 1], [N, 3, H, W]; a video [N, F, 3, H, W]) and their prompt strings, returning
N scores; ``--reward-server URL``, a reward server of scripts/reward_server.py (docs/rewards.md, "Remote rewards");
or ``--vlm-judge URL --vlm-model NAME``, a vision-language model served by vLLM or SGLang asked whether each image
shows its prompt (branchgrpo.vlm_judge; docs/rewards.md, "VLM judge").
``--eval-prompts FILE`` samples each held-out prompt by the ODE from the same noise at the start, every
``--eval-every`` iterations and at the end, and writes its scores (eval.jsonl, TensorBoard) and an image grid
(OUTPUT/eval/iteration-NNNNNN.png).
A ``--tiny`` pipeline has no VAE: its "images" are the first three latent channels, clamped to [-1, 1].
"""

from __future__ import annotations

import argparse
import base64
import copy
import importlib
import inspect
import itertools
import json
import os
import sys
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import branchgrpo
from branchgrpo import diffusers as adapters
from branchgrpo.vlm_judge import DEFAULT_QUESTION, VLMJudge, png_bytes

DEFAULT_TARGETS = {
    "flux": "to_q,to_k,to_v,to_out.0",
    "sd3": "to_q,to_k,to_v,to_out.0",
    "wan": "to_q,to_k,to_v,to_out.0",
    "qwenimage": "to_q,to_k,to_v,to_out.0",
    "flux2": "to_q,to_k,to_v,to_out.0,to_qkv_mlp_proj",  # the last: the single-stream blocks' fused projection
}
# The tiny pipelines have no text encoder: their "encoder" maps a string to seeded random embeddings of these widths
# (sequence length, context width, pooled width or None), the ones each family's tiny transformer takes.
TINY_TEXT = {
    "flux": (5, 32, 32),
    "sd3": (6, 32, 64),
    "wan": (6, 32, None),
    "qwenimage": (6, 16, None),
    "flux2": (5, 32, None),
}


class Failure(Exception):
    """A bad input: the script prints its one line and exits with status 2."""


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model = parser.add_argument_group("model")
    model.add_argument("--model", required=True, help=f"the adapter family: {', '.join(adapters.families())}")
    source = model.add_mutually_exclusive_group(required=True)
    source.add_argument("--pretrained", help="a diffusers pipeline directory (or hub name) of that family")
    source.add_argument("--tiny", action="store_true", help="the family's tiny random pipeline (no download)")
    model.add_argument("--tiny-variant", default=None, help="wan: wan2.1, a14b, ti2v; flux2: dev, klein-base, klein")
    model.add_argument("--full", action="store_true", help="fine-tune every transformer weight instead of a LoRA")
    model.add_argument("--fsdp", action="store_true", help="shard the transformer with FSDP2 (default: DDP)")
    model.add_argument("--lora-rank", type=int, default=16)
    model.add_argument("--lora-alpha", type=float, default=None, help="default: the rank (scale 1)")
    model.add_argument("--lora-targets", default=None, help="comma-separated module names (default: attention)")
    model.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="bfloat16: autocast, float32 trained weights",
    )
    model.add_argument("--device", default=None, help="default: cuda (this process's local rank) if any, else cpu")

    data = parser.add_argument_group("data")
    data.add_argument("--prompts", required=True, help="a .txt (one prompt a line) or .jsonl (prompt, negative_prompt)")
    data.add_argument("--height", type=int, default=None, help="default: 512 (64 with --tiny)")
    data.add_argument("--width", type=int, default=None, help="default: 512 (64 with --tiny)")
    data.add_argument("--num-frames", type=int, default=None, help="wan only (default: 81, 5 with --tiny)")
    data.add_argument("--guidance-scale", type=float, default=None, help="default: the pipeline's (Qwen: true CFG)")

    data.add_argument("--eval-prompts", default=None, help="held-out prompts (.txt / .jsonl) sampled by the ODE")
    data.add_argument("--eval-every", type=int, default=10, help="iterations between evaluations (0: start and end)")

    rewards = parser.add_argument_group("reward")
    reward = rewards.add_mutually_exclusive_group(required=True)
    reward.add_argument("--reward", help="module:function, called as function(images, prompts) -> N scores")
    reward.add_argument("--reward-server", metavar="URL", help="a reward server (scripts/reward_server.py)")
    reward.add_argument("--vlm-judge", metavar="URL", help="an OpenAI-compatible VLM server (vLLM, SGLang) as judge")
    rewards.add_argument("--reward-scorer", default=None, help="the server's scorer (default: its only one)")
    rewards.add_argument("--vlm-model", default=None, help="the judge's model, as the server's /v1/models lists it")
    rewards.add_argument(
        "--vlm-question", default=DEFAULT_QUESTION, help="the judge's question; {prompt} is the prompt"
    )

    run = parser.add_argument_group("run")
    run.add_argument("--method", default="branch", help=f"one of {', '.join(branchgrpo.methods())}")
    run.add_argument("--steps", type=int, default=20)
    run.add_argument("--iterations", type=int, default=100)
    run.add_argument("--prompts-per-iteration", type=int, default=4)
    run.add_argument("--learning-rate", type=float, default=1e-4)
    run.add_argument("--max-grad-norm", type=float, default=1.0)
    run.add_argument("--max-batch", type=int, default=16, help="rows per model call")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--output", required=True, help="directory for metrics, checkpoints and the final weights")
    run.add_argument("--checkpoint-every", type=int, default=10, help="iterations between checkpoints (0: at end)")
    run.add_argument("--resume", default=None, help="a checkpoint file (OUTPUT/checkpoints/iteration-*.pt)")
    args = parser.parse_args(argv)
    if args.model not in adapters.families():
        parser.error(f"--model {args.model!r}: unknown (known: {', '.join(adapters.families())})")
    if args.method not in branchgrpo.methods():
        parser.error(f"--method {args.method!r}: unknown (known: {', '.join(branchgrpo.methods())})")
    for name in ("steps", "iterations", "prompts_per_iteration", "lora_rank", "max_batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be at least 1")
    variants = getattr(getattr(adapters, args.model), "VARIANTS", ())
    if args.tiny_variant is not None and (not args.tiny or args.tiny_variant not in variants):
        known = f"with --tiny: {', '.join(variants)}" if variants else "none"
        parser.error(f"--tiny-variant {args.tiny_variant!r}: {args.model}'s variants are {known}")
    if args.eval_every < 0:
        parser.error(f"--eval-every {args.eval_every}: must be at least 0")
    if args.vlm_judge and not args.vlm_model:
        parser.error("--vlm-judge needs --vlm-model (the served model's name)")
    size = 64 if args.tiny else 512
    args.height, args.width = args.height or size, args.width or size
    args.num_frames = args.num_frames or (5 if args.tiny else 81)
    return args


# --- Processes: torchrun and accelerate launch set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT ---


def start_processes(args: argparse.Namespace) -> tuple[int, int, torch.device]:
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if args.device is None:
        args.device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        return dist.get_rank(), dist.get_world_size(), device
    return 0, 1, device


# --- The pipeline and its prompts ---


def load_pipeline(args: argparse.Namespace) -> Any:
    family = getattr(adapters, args.model)
    if args.tiny:
        variant = {"variant": args.tiny_variant} if args.tiny_variant else {}
        return family.tiny_pipeline(args.seed, **variant)
    import diffusers

    # The pipeline class its model_index.json names (FLUX.2 [dev] or [klein], Wan2.1 or Wan2.2 ...). Text encoders
    # and VAE in bfloat16 with --dtype bfloat16; the transformer's trained weights are cast back below.
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    pipeline = diffusers.DiffusionPipeline.from_pretrained(args.pretrained, torch_dtype=dtype)
    adapter = adapters.ADAPTERS[adapters.families().index(args.model)]
    if not any(cls.__name__ in adapter.pipelines for cls in type(pipeline).__mro__):
        raise Failure(
            f"--pretrained {args.pretrained}: a {type(pipeline).__name__}, not a --model {args.model} pipeline "
            f"({', '.join(adapter.pipelines)})"
        )
    return pipeline


def read_prompts(path: str) -> tuple[list[str], list[str] | None]:
    """The prompts of a .txt (one a line, blank lines skipped) or .jsonl file ("prompt", optional "negative_prompt"),
    and the negative prompts ("" where a line has none) if any line has one."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise Failure(f"--prompts {path}: cannot read it ({error})") from None
    prompts, negatives = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if path.endswith(".jsonl"):
            try:
                record = json.loads(line)
                prompts.append(str(record["prompt"]))
                negatives.append(str(record.get("negative_prompt", "")))
            except (ValueError, KeyError, TypeError) as error:
                raise Failure(f"--prompts {path}, line {number}: not a JSON object with a prompt ({error})") from None
        else:
            prompts.append(line.strip())
            negatives.append("")
    if not prompts:
        raise Failure(f"--prompts {path}: no prompts in it")
    return prompts, negatives if any(negatives) else None


def tiny_embeddings(family: str, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The tiny pipelines' stand-in text encoder: each string's embeddings drawn from a generator seeded by its CRC."""
    length, width, pooled_width = TINY_TEXT[family]
    context, pooled = [], []
    for text in texts:
        generator = torch.Generator().manual_seed(zlib.crc32(text.encode()))
        context.append(torch.randn(length, width, generator=generator))
        pooled.append(torch.randn(pooled_width or 1, generator=generator))
    return torch.stack(context), torch.stack(pooled) if pooled_width else None


def runs_cfg(args: argparse.Namespace, pipeline: Any) -> bool:
    """Whether the family's adapter runs CFG by its guidance scale (--guidance-scale or the adapter's default) with
    no negative prompt given: SD3, Wan, FLUX.2 [klein] not distilled, where the scale is > 1. (FLUX.1 and FLUX.2
    [dev] embed their guidance; Qwen-Image runs true CFG only with a negative prompt.)"""
    if args.model == "flux2":
        if type(pipeline).__name__ != "Flux2KleinPipeline" or pipeline.config.get("is_distilled", False):
            return False
    elif args.model not in ("sd3", "wan"):
        return False
    adapter = adapters.ADAPTERS[adapters.families().index(args.model)]
    default = inspect.signature(adapter.__init__).parameters["guidance_scale"].default
    return (default if args.guidance_scale is None else args.guidance_scale) > 1


def make_adapter(args: argparse.Namespace, pipeline: Any, prompts: list[str], negatives: list[str] | None) -> Any:
    """The family's adapter over every prompt of the file (prompt index p is line p), encoded once."""
    options: dict[str, Any] = {}
    if args.guidance_scale is not None:
        options["true_cfg_scale" if args.model == "qwenimage" else "guidance_scale"] = args.guidance_scale
    cfg = runs_cfg(args, pipeline)
    if not args.tiny or (negatives and not cfg and args.model != "qwenimage"):  # (the adapter's refusal, its words)
        return adapters.adapter_for(pipeline, prompts, negative_prompt=negatives, **options)
    context, pooled = tiny_embeddings(args.model, prompts)
    options["prompt_embeds"] = context
    if pooled is not None:
        options["pooled_prompt_embeds"] = pooled
    if negatives or cfg:  # CFG's default negative prompt is "", as the pipelines'
        negative_context, negative_pooled = tiny_embeddings(args.model, negatives or [""] * len(prompts))
        options["negative_prompt_embeds"] = negative_context
        if negative_pooled is not None:
            options["negative_pooled_prompt_embeds"] = negative_pooled
    return adapters.adapter_for(pipeline, **options)


def free_text_encoders(pipeline: Any) -> None:
    """The prompts are encoded: the text encoders are not needed any more."""
    for name in ("text_encoder", "text_encoder_2", "text_encoder_3"):
        if getattr(pipeline, name, None) is not None:
            setattr(pipeline, name, None)


# --- The reward ---


def decode(adapter: Any, family: str, leaves: torch.Tensor) -> torch.Tensor:
    """Leaves (engine rows) as float32 RGB in [-1, 1]: [N, 3, H, W], or [N, F, 3, H, W] for Wan's videos."""
    vae = getattr(adapter.pipeline, "vae", None)
    if vae is None:  # a tiny pipeline: the first three latent channels
        rgb = leaves[:, :3].float().clamp(-1, 1)
        return rgb.transpose(1, 2).contiguous() if family == "wan" else rgb
    config, parameter = vae.config, next(vae.parameters())
    with torch.no_grad():
        z = leaves.to(parameter.device, parameter.dtype)
        if family in ("flux", "sd3"):
            z = z / config.scaling_factor + (config.shift_factor or 0.0)
            return vae.decode(z, return_dict=False)[0].float().clamp(-1, 1)
        if family == "flux2":  # de-normalized by the VAE's batch norm and unpatchified, as the pipeline does
            return vae.decode(adapter.vae_latents(z), return_dict=False)[0].float().clamp(-1, 1)
        mean = torch.tensor(config.latents_mean, device=z.device, dtype=z.dtype).view(1, -1, 1, 1, 1)
        std = torch.tensor(config.latents_std, device=z.device, dtype=z.dtype).view(1, -1, 1, 1, 1)
        z = (z.unsqueeze(2) if family == "qwenimage" else z) * std + mean
        video = vae.decode(z, return_dict=False)[0].float().clamp(-1, 1)  # [N, 3, F, H, W]
        return video[:, :, 0] if family == "qwenimage" else video.transpose(1, 2).contiguous()


def local_reward(spec: str) -> Any:
    module_name, _, function_name = spec.partition(":")
    sys.path.insert(0, os.getcwd())
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError, ValueError) as error:
        raise Failure(f"--reward {spec}: cannot load it as module:function ({error})") from None
    if not callable(function):
        raise Failure(f"--reward {spec}: not callable")
    return function


class RemoteReward:
    """A client of the reward server protocol v1 (docs/rewards.md): float32 pixels, one POST /score per call."""

    def __init__(self, url: str, scorer: str | None, media: str, timeout: float = 300.0) -> None:
        self.url, self.media, self.timeout = url.rstrip("/"), media, timeout
        try:
            info = self._request("GET", "/info", None, 10.0)
        except (OSError, ValueError) as error:
            raise Failure(f"--reward-server {url}: not reachable ({error})") from None
        scorers = {s["name"]: s for s in info.get("scorers", [])}
        if scorer is None and len(scorers) == 1:
            scorer = next(iter(scorers))
        if scorer not in scorers:
            raise Failure(f"--reward-scorer {scorer}: {url} runs {', '.join(scorers)} (name one)")
        if media not in scorers[scorer]["media"]:
            raise Failure(f"--reward-server {url}: scorer {scorer} takes {scorers[scorer]['media']}, not {media}")
        self.scorer = scorer

    def _request(self, method: str, path: str, body: Any, timeout: float) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as error:
            raise ValueError(f"{self.url}{path}: HTTP {error.code}: {error.read().decode(errors='replace')}") from None

    def __call__(self, images: torch.Tensor, prompts: list[str], indices: list[int]) -> list[float]:
        items, leaf_in_group = [], {}
        for image, prompt, index in zip(images, prompts, indices, strict=True):
            pixels = image.detach().cpu().float().contiguous().numpy().astype("<f4")
            leaf_in_group[index] = leaf_in_group.get(index, -1) + 1
            data = {"shape": list(pixels.shape), "base64": base64.b64encode(pixels.tobytes()).decode()}
            items.append({"prompt": prompt, "prompt_index": index, "group": index, "leaf": leaf_in_group[index],
                          "data": data})  # fmt: skip
        body = {"protocol": 1, "scorer": self.scorer, "media": self.media, "encoding": "float32", "items": items}
        return self._request("POST", "/score", body, self.timeout)["scores"]


def decode_all(adapter: Any, family: str, leaves: torch.Tensor) -> torch.Tensor:
    """``decode`` in chunks of 8 leaves (the VAE's memory)."""
    return torch.cat([decode(adapter, family, chunk) for chunk in leaves.split(8)])


def make_reward(args: argparse.Namespace, adapter: Any, prompts: list[str]) -> tuple[Any, Any]:
    """reward(leaves, prompt indices) for the Trainer (decode, then score), and score(images, prompt indices): the
    user's function, the server or the judge on decoded images."""
    if args.reward_server:
        server = RemoteReward(args.reward_server, args.reward_scorer, "video" if args.model == "wan" else "image")
    elif args.vlm_judge:
        try:
            judge = VLMJudge(args.vlm_judge, args.vlm_model, question=args.vlm_question)
        except RuntimeError as error:
            raise Failure(f"--vlm-judge {args.vlm_judge}: {error}") from None
    else:
        function = local_reward(args.reward)

    def score(images: torch.Tensor, index_list: list[int]) -> torch.Tensor:
        texts = [prompts[i] for i in index_list]
        if args.reward_server:
            scores = server(images, texts, index_list)
        else:
            scores = judge(images, texts) if args.vlm_judge else function(images, texts)
        return torch.as_tensor(scores, dtype=torch.float64).flatten().cpu()

    def reward(leaves: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return score(decode_all(adapter, args.model, leaves), indices.tolist())

    return reward, score


# --- The trainable weights ---


def add_lora(args: argparse.Namespace, transformer: torch.nn.Module) -> None:
    from peft import LoraConfig

    targets = (args.lora_targets or DEFAULT_TARGETS[args.model]).split(",")
    names = [name for name, _ in transformer.named_modules()]
    for target in targets:
        if not any(name == target or name.endswith("." + target) for name in names):
            raise Failure(f"--lora-targets {target}: the {type(transformer).__name__} has no module of that name")
    transformer.requires_grad_(False)
    alpha = args.lora_alpha if args.lora_alpha is not None else args.lora_rank
    config = LoraConfig(r=args.lora_rank, lora_alpha=alpha, target_modules=targets, init_lora_weights="gaussian")
    transformer.add_adapter(config)
    for parameter in transformer.parameters():
        if parameter.requires_grad:
            parameter.data = parameter.data.float()  # fp32 master weights of the LoRA, beside a bf16 base


def trainable(transformer: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in transformer.named_parameters() if p.requires_grad}


class DistributedTransformer(torch.nn.parallel.DistributedDataParallel):
    """DDP that also answers the wrapped transformer's attributes (its config, dtype), as the adapters read them."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


def autocast_velocity(velocity: Any, device: torch.device, dtype: str) -> Any:
    if dtype == "float32":
        return velocity

    def in_bfloat16(*arguments: Any) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return velocity(*arguments)

    return in_bfloat16


# --- Held-out evaluation ---


def sample_ode(velocity: Any, noise: torch.Tensor, sigmas: list[float], indices: list[int], max_batch: int) -> Any:
    """The ODE's sample of each row of ``noise`` with its prompt index: Euler steps x + (sigma' - sigma) v on the
    sigmas, the pipeline's own sampler (eta = 0), at most ``max_batch`` rows per model call."""
    out = []
    for start in range(0, len(indices), max_batch):
        x = noise[start : start + max_batch]
        rows = torch.tensor(indices[start : start + max_batch], device=noise.device)
        for step, (sigma, sigma_next) in enumerate(itertools.pairwise(sigmas)):
            x = x + (sigma_next - sigma) * velocity(x, sigma, step, rows, None)
        out.append(x)
    return torch.cat(out)


def image_grid(images: torch.Tensor, columns: int = 8) -> torch.Tensor:
    """Images [N, 3, H, W] (a video's middle frame) tiled row-major into one [3, rows H, columns W] image, the
    empty cells black."""
    if images.dim() == 5:
        images = images[:, images.shape[1] // 2]
    n, _, h, w = images.shape
    columns = min(columns, n)
    rows = -(-n // columns)
    grid = torch.full((3, rows * h, columns * w), -1.0)
    for i, image in enumerate(images):
        grid[:, (i // columns) * h : (i // columns + 1) * h, (i % columns) * w : (i % columns + 1) * w] = image
    return grid


class Evaluation:
    """The held-out prompts (indices ``first`` on in the adapter's rows), each sampled by the ODE from the same
    noise at every evaluation with the weights of that moment, decoded, scored by the run's reward and tiled into
    OUTPUT/eval/iteration-NNNNNN.png."""

    def __init__(self, args: argparse.Namespace, first: int, count: int, latent_shape: list[int], output: Path) -> None:
        self.args, self.indices, self.output = args, list(range(first, first + count)), output / "eval"
        generator = torch.Generator().manual_seed(args.seed + 1)  # not the training noise's keys
        self.noise = torch.randn([count, *latent_shape], generator=generator)

    def due(self, iteration: int) -> bool:
        every = self.args.eval_every
        return iteration == 0 or iteration == self.args.iterations or bool(every and iteration % every == 0)

    def __call__(self, iteration: int, velocity: Any, sigmas: list[float], adapter: Any, score: Any) -> dict:
        experts = getattr(adapter, "transformers", (adapter.transformer,))
        was_training = experts[0].training
        for expert in experts:
            expert.eval()
        noise = self.noise.to(next(experts[0].parameters()).device)
        leaves = sample_ode(velocity, noise, sigmas, self.indices, self.args.max_batch)
        for expert in experts:
            expert.train(was_training)
        images = decode_all(adapter, self.args.model, leaves)  # once: scored and tiled
        scores = score(images, self.indices)
        self.output.mkdir(parents=True, exist_ok=True)
        grid = image_grid(images)
        (self.output / f"iteration-{iteration:06d}.png").write_bytes(png_bytes(grid))
        return {"eval_reward_mean": float(scores.mean()), "eval_rewards": scores.tolist(), "grid": grid}


# --- FSDP2 ---


def shard(transformer: torch.nn.Module) -> None:
    """FSDP2 (``fully_shard``) over each block of the transformer's block lists, then over the whole."""
    from torch.distributed.fsdp import fully_shard

    for child in transformer.children():
        if isinstance(child, torch.nn.ModuleList):
            for block in child:
                fully_shard(block)
    fully_shard(transformer)


class GatheredWeights:
    """FSDP2 for the rollout and the evaluation: their forwards run on whole weights, gathered once per iteration
    on every rank (``gather``, a collective) and kept through any number of forwards, so that a rank with fewer trees
    may make fewer calls. The update's first forward lets them go (``release``, local) and runs sharded, every rank
    making the same number of calls (the Trainer pads them). The rollout's memory is then that of DDP's."""

    def __init__(self, transformer: torch.nn.Module) -> None:
        from torch.distributed.fsdp import FSDPModule

        self.root = transformer
        self.modules = [m for m in transformer.modules() if isinstance(m, FSDPModule)]
        self.gathered = False

    def gather(self) -> None:
        if not self.gathered:
            for module in self.modules:
                module.unshard()
            self.root.set_reshard_after_forward(False)
            self.gathered = True

    def release(self) -> None:
        if self.gathered:
            for module in self.modules:
                module.reshard()
            self.root.set_reshard_after_forward(True)
            self.gathered = False

    def releasing(self, velocity: Any) -> Any:
        def sharded(*arguments: Any) -> torch.Tensor:
            self.release()
            return velocity(*arguments)

        return sharded


# --- Checkpoints ---


def full_weights(args: argparse.Namespace, transformer: torch.nn.Module, only_trained: bool = True) -> dict:
    """The (trained) weights, whole on the CPU: under FSDP2 gathered from the shards (a collective: every rank calls
    it; rank 0 holds the result)."""
    names = trainable(transformer)
    if not args.fsdp:
        return {k: p.detach().cpu() for k, p in transformer.state_dict().items() if k in names or not only_trained}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    model = get_model_state_dict(transformer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v for k, v in model.items() if k in names or not only_trained}


def optimizer_state(args: argparse.Namespace, transformer: torch.nn.Module, optimizer: Any) -> dict:
    """The optimizer's state (under FSDP2 whole, keyed by weight names: a collective)."""
    if not args.fsdp:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(transformer, optimizer, options=options)


def save_checkpoint(args: argparse.Namespace, path: Path, transformer: Any, optimizer: Any, trainer: Any) -> None:
    """Every rank calls it; rank 0 writes (atomically)."""
    model, optimizer_state_ = full_weights(args, transformer), optimizer_state(args, transformer, optimizer)
    if trainer.rank != 0:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"model": model, "optimizer": optimizer_state_, "trainer": trainer.state_dict(), "fsdp": args.fsdp}
    torch.save(state, str(path) + ".tmp")
    os.replace(str(path) + ".tmp", path)


def load_checkpoint(args: argparse.Namespace, path: str, transformer: Any, optimizer: Any, trainer: Any) -> None:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError) as error:
        raise Failure(f"--resume {path}: cannot read it ({error})") from None
    parameters = trainable(transformer)
    if sorted(state["model"]) != sorted(parameters):
        raise Failure(f"--resume {path}: its weights are not this run's trainable ones (other --full / LoRA options?)")
    if state.get("fsdp", False) != args.fsdp:
        raise Failure(f"--resume {path}: written {'with' if args.fsdp else 'without'} --fsdp, resumed the other way")
    if args.fsdp:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, strict=False)
        set_model_state_dict(transformer, state["model"], options=options)
        set_optimizer_state_dict(transformer, optimizer, state["optimizer"], options=options)
    else:
        with torch.no_grad():
            for name, value in state["model"].items():
                parameters[name].copy_(value)
        optimizer.load_state_dict(state["optimizer"])
    trainer.load_state_dict(state["trainer"])


def save_final(args: argparse.Namespace, pipeline: Any, experts: list, output: Path, rank: int) -> list[Path]:
    """Each trained expert's LoRA in diffusers' format (``load_lora_weights`` loads it; Wan2.2 A14B's second with
    ``load_into_transformer_2=True``): OUTPUT/lora (and lora_2); with --full its weights and config
    (``from_pretrained`` loads them): OUTPUT/transformer (and transformer_2). Every rank calls it; rank 0 writes."""
    weights = full_weights(args, experts[0], only_trained=not args.full) if args.fsdp else {}  # one expert
    if rank != 0:
        return []
    folders = []
    for number, expert in enumerate(experts):
        suffix = f"_{number + 1}" if number else ""
        folder = output / (f"transformer{suffix}" if args.full else f"lora{suffix}")
        if args.full and not args.fsdp:
            expert.save_pretrained(folder)
        elif args.full:
            from safetensors.torch import save_file

            expert.save_config(folder)
            save_file({k: v.contiguous() for k, v in weights.items()}, folder / "diffusion_pytorch_model.safetensors")
        else:
            from peft.utils import get_peft_model_state_dict

            layers = get_peft_model_state_dict(expert, state_dict=weights or None)
            type(pipeline).save_lora_weights(folder, transformer_lora_layers=layers)
        folders.append(folder)
    return folders


# --- The run ---


def train(args: argparse.Namespace) -> None:
    rank, size, device = start_processes(args)
    output = Path(args.output)
    prompts, negatives = read_prompts(args.prompts)
    train_count = len(prompts)
    if args.eval_prompts:  # held out: after the training prompts in the adapter's rows
        eval_prompts, eval_negatives = read_prompts(args.eval_prompts)
        if negatives or eval_negatives:
            negatives = (negatives or [""] * train_count) + (eval_negatives or [""] * len(eval_prompts))
        prompts = prompts + eval_prompts
    pipeline = load_pipeline(args)
    pipeline.to(device)
    adapter = make_adapter(args, pipeline, prompts, negatives)
    free_text_encoders(pipeline)
    reward, score = make_reward(args, adapter, prompts)

    # The trained transformers: one, or Wan2.2 A14B's two experts (each with its LoRA), as one module.
    experts = list(getattr(adapter, "transformers", (pipeline.transformer,)))
    if len(experts) > 1 and args.fsdp:
        raise Failure(
            "--fsdp: not with Wan2.2 A14B's two experts (each rank's update calls them in its own order); without "
            "--fsdp they train on several processes with their gradients summed over the ranks"
        )
    torch.manual_seed(args.seed)  # the LoRA's initial weights, equal on every rank
    for expert in experts:
        if args.full:
            expert.float().requires_grad_(True)
        else:
            add_lora(args, expert)
        expert.train()
    transformer = experts[0] if len(experts) == 1 else torch.nn.ModuleDict({"high": experts[0], "low": experts[1]})
    gathered = None
    if args.fsdp:  # sharded in place: the adapters call it as before
        shard(transformer)
        gathered = GatheredWeights(transformer)
    optimizer = torch.optim.AdamW(trainable(transformer).values(), lr=args.learning_rate)

    # The rollout calls the plain transformer (under FSDP2 on gathered weights); the update calls it through DDP
    # on several processes (under FSDP2 sharded). Two experts: both plain, the Trainer sums their gradients over the
    # ranks after the backward passes (DDP would pair one rank's high-noise pass with another's low-noise one).
    sample_adapter, train_adapter = adapter, copy.copy(adapter)
    train_adapter.gradients = True
    ddp = size > 1 and not args.fsdp and len(experts) == 1
    if ddp:
        device_ids = [device.index] if device.type == "cuda" else None
        train_adapter.transformer = DistributedTransformer(transformer, device_ids=device_ids)
        if hasattr(adapter, "transformers"):  # Wan calls its experts through this tuple
            train_adapter.transformers = (train_adapter.transformer,)
    sample_velocity = autocast_velocity(sample_adapter.velocity, device, args.dtype)
    train_velocity = autocast_velocity(train_adapter.velocity, device, args.dtype)
    policy = branchgrpo.Policy(
        gathered.releasing(train_velocity) if gathered else train_velocity,
        optimizer,
        sample_velocity=sample_velocity,
        parameters=trainable(transformer).values(),
        gradients="averaged" if ddp or args.fsdp else "sum",
        max_grad_norm=args.max_grad_norm,
    )
    latent_shape = (
        adapter.latent_shape(args.height, args.width, num_frames=args.num_frames)
        if args.model == "wan"
        else adapter.latent_shape(args.height, args.width)
    )
    sigmas = adapter.sigmas(args.steps, args.height, args.width)
    trainer = branchgrpo.Trainer(
        policy,
        reward,
        latent_shape=latent_shape,
        method=args.method,
        steps=args.steps,
        sigmas=sigmas,
        seed=args.seed,
        max_batch=args.max_batch,
        total_iterations=args.iterations,
        device=device,
        dtype=torch.float32,
    )
    if args.resume:
        load_checkpoint(args, args.resume, transformer, optimizer, trainer)

    writer = None
    if rank == 0:
        output.mkdir(parents=True, exist_ok=True)
        try:
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(str(output / "tensorboard"))
        except ImportError:
            print("note: tensorboard is not installed: no TensorBoard scalars (metrics.jsonl has them)")
        print(f"{args.model}: {train_count} prompts ({len(prompts) - train_count} held out), latents {latent_shape}, "
              f"{size} process(es) on {device}, "
              f"{sum(p.numel() for p in trainable(transformer).values())} trained weights")  # fmt: skip
    evaluation = None
    if args.eval_prompts:
        evaluation = Evaluation(args, train_count, len(prompts) - train_count, latent_shape, output)

    def evaluate(iteration: int) -> None:
        """On rank 0 with the plain transformer (no collective), the other ranks waiting."""
        if evaluation is None or not evaluation.due(iteration):
            return
        if gathered:
            gathered.gather()
        if rank == 0:
            result = evaluation(iteration, sample_velocity, sigmas, adapter, score)
            record = {"iteration": iteration, "eval_reward_mean": result["eval_reward_mean"],
                      "eval_rewards": result["eval_rewards"]}  # fmt: skip
            with open(output / "eval.jsonl", "a", encoding="utf-8") as log:
                log.write(json.dumps(record) + "\n")
            if writer is not None:
                writer.add_scalar("eval_reward_mean", result["eval_reward_mean"], iteration)
                writer.add_image("eval", (result["grid"] + 1) / 2, iteration)
            print(f"evaluation at iteration {iteration}: reward {result['eval_reward_mean']:.4f}")
        if size > 1:
            dist.barrier()

    if not args.resume:
        evaluate(0)
    while trainer.iteration < args.iterations:
        iteration = trainer.iteration
        start = iteration * args.prompts_per_iteration
        batch = [(start + j) % train_count for j in range(min(args.prompts_per_iteration, train_count))]
        began = time.perf_counter()
        if gathered:
            gathered.gather()
        stats = trainer.step(batch)
        stats["iteration_seconds"] = time.perf_counter() - began
        done = trainer.iteration
        checkpoint = args.checkpoint_every and done % args.checkpoint_every == 0 or done == args.iterations
        if rank == 0:
            with open(output / "metrics.jsonl", "a", encoding="utf-8") as metrics:
                metrics.write(json.dumps({**stats, "iteration": done}) + "\n")
            if writer is not None:
                for key, value in stats.items():
                    writer.add_scalar(key, value, done)
            print(f"iteration {done}: reward {stats['reward_mean']:.4f}, loss {stats['loss']:.4g}, "
                  f"{stats['edges_trained']:.0f} edges, {stats['iteration_seconds']:.2f} s")  # fmt: skip
        if checkpoint:
            path = output / "checkpoints" / f"iteration-{done:06d}.pt"
            save_checkpoint(args, path, transformer, optimizer, trainer)
            if size > 1:
                dist.barrier()
        evaluate(done)

    saved = save_final(args, pipeline, experts, output, rank)
    if rank == 0:
        if writer is not None:
            writer.close()
        print(f"saved {', '.join(str(folder) for folder in saved)}")
    if size > 1:
        # DDP's reducer and gloo's threads wind down before the group goes: every rank here, the wrapper
        # released, every rank again, then the group destroyed.
        dist.barrier()
        del trainer, policy, train_adapter
        dist.barrier()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    try:
        train(args)
    except (Failure, ValueError, TypeError) as error:
        # One line naming the value (the package's and the adapters' errors are written that way).
        print(f"train.py: error: {' '.join(str(error).split())}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
