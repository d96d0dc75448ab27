"""Flow-Factory's own loop with the tree trainer (branchgrpo.flow_factory), on a tiny random-weight SD3 on the CPU.

Runs only where ``BRANCHGRPO_FLOW_FACTORY`` names a Flow-Factory checkout (github X-GenGroup/Flow-Factory) and the
interpreter has its dependencies: scripts/flow_factory_env.sh CHECKOUT makes that environment and runs this file.
The test saves a tiny StableDiffusion3Pipeline (random transformer, VAE, two CLIP and a T5 text encoder, tokenizers
built here) and a two-prompt dataset, writes a Flow-Factory YAML config whose ``trainer_type`` is the trainer's CLI
name, and runs what Flow-Factory's ``train.py`` runs: ``Arguments.load_from_yaml``, ``load_trainer`` and
``start()``, for two epochs. It checks the registries, the trees in the samples, the advantages against
``branchgrpo.credit``, the log-probs against the engine's and the adapter's forward, and that the weights moved.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

CHECKOUT = os.environ.get("BRANCHGRPO_FLOW_FACTORY", "")
if not CHECKOUT:
    pytest.skip(
        "BRANCHGRPO_FLOW_FACTORY names no Flow-Factory checkout (scripts/flow_factory_env.sh CHECKOUT runs this test)",
        allow_module_level=True,
    )

REWARD_NAME = "branchgrpo-test-redness"
PROMPTS = ["a red circle", "a blue square"]
STEPS = 4


def _flow_factory_on_path() -> None:
    source = Path(CHECKOUT) / "src"
    if not (source / "flow_factory" / "__init__.py").is_file():
        pytest.fail(f"BRANCHGRPO_FLOW_FACTORY = {CHECKOUT!r}: no src/flow_factory there (a Flow-Factory checkout)")
    if str(source) not in sys.path:
        sys.path.insert(0, str(source))


def _redness(image: torch.Tensor) -> torch.Tensor:
    """The test's reward of images [N, 3, H, W] in [0, 1]: mean red minus mean blue."""
    return image[:, 0].flatten(1).mean(1) - image[:, 2].flatten(1).mean(1)


def _register_reward() -> None:
    """A pointwise Flow-Factory reward model (tensor inputs) in its registry: ``_redness``."""
    from flow_factory.rewards.abc import PointwiseRewardModel, RewardModelOutput
    from flow_factory.rewards.registry import register_reward_model

    class RednessReward(PointwiseRewardModel):
        use_tensor_inputs = True

        def __call__(self, prompt: list[str], image: list[torch.Tensor] | None = None, **kwargs: Any):
            return RewardModelOutput(rewards=_redness(torch.stack(image).float().cpu()), extra_info={})

    RednessReward.__module__ = __name__
    globals()["RednessReward"] = RednessReward
    register_reward_model(REWARD_NAME)(RednessReward)


def _tiny_sd3(path: Path) -> None:
    """A StableDiffusion3Pipeline saved at ``path`` that Flow-Factory's sd3-5 adapter loads with from_pretrained:
    the package's tiny random transformer (4 latent channels, patch 2, context 32, pooled 64), a VAE of scale factor
    2, two CLIP text encoders (hidden 16, projection 32) and a T5 encoder (d_model 32), tokenizers on a small vocab."""
    from diffusers import StableDiffusion3Pipeline

    from branchgrpo.diffusers import sd3

    clip_tokenizer, t5_tokenizer, clip_vocab, t5_vocab = _tokenizers()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        encoder, encoder_3 = _text_encoders(clip_vocab, t5_vocab, hidden=16, projection=32)
        encoder_2, _ = _text_encoders(clip_vocab, t5_vocab, hidden=16, projection=32)
        vae = _vae()
    base = sd3.tiny_pipeline(seed=1)
    pipeline = StableDiffusion3Pipeline(
        transformer=base.transformer, scheduler=base.scheduler, vae=vae,
        text_encoder=encoder, tokenizer=clip_tokenizer, text_encoder_2=encoder_2, tokenizer_2=clip_tokenizer,
        text_encoder_3=encoder_3, tokenizer_3=t5_tokenizer,
    )  # fmt: skip
    pipeline.save_pretrained(path)


def _tokenizers() -> tuple[Any, Any, int, int]:
    """A CLIP and a T5 tokenizer on the prompts' small vocabulary, and their vocabulary sizes."""
    from transformers import CLIPTokenizer, T5Tokenizer

    words = sorted({w for p in PROMPTS for w in p.split()} | {"a", "the", "on"})
    letters = "abcdefghijklmnopqrstuvwxyz"
    tokens = ["<|startoftext|>", "<|endoftext|>"] + [w + "</w>" for w in words] + list(letters)
    tokens += [c + "</w>" for c in letters if c + "</w>" not in tokens]
    clip = CLIPTokenizer(vocab={t: i for i, t in enumerate(tokens)}, merges=[], model_max_length=16)
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [("\u2581" + w, -1.0) for w in words]
    t5 = T5Tokenizer(vocab=pieces, extra_ids=0)
    return clip, t5, len(tokens), len(words) + 3


def _text_encoders(clip_vocab: int, t5_vocab: int, hidden: int, projection: int | None) -> tuple[Any, Any]:
    """A random CLIP text encoder (with a projection where ``projection`` is given) and T5 encoder (d_model 32)."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    config = CLIPTextConfig(
        vocab_size=clip_vocab, hidden_size=hidden, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=16, projection_dim=projection or hidden, bos_token_id=0, eos_token_id=1,
        pad_token_id=1,
    )  # fmt: skip
    clip = CLIPTextModelWithProjection(config) if projection else CLIPTextModel(config)
    t5 = T5EncoderModel(T5Config(vocab_size=t5_vocab, d_model=32, d_kv=8, d_ff=32, num_layers=1, num_heads=2))
    return clip, t5


def _vae() -> Any:
    """A random AutoencoderKL of 4 latent channels and scale factor 2."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 8), layers_per_block=1, latent_channels=4,
        norm_num_groups=4, sample_size=16, shift_factor=0.0, scaling_factor=1.0,
    )  # fmt: skip


def _tiny_flux(path: Path) -> None:
    """A FluxPipeline saved at ``path`` for Flow-Factory's flux1 adapter: the package's tiny random transformer
    (16 packed channels, context 32, pooled 32, guidance embedding), a VAE of scale factor 2, a CLIP text encoder
    (hidden 32), a T5 encoder (d_model 32), tokenizers on a small vocabulary."""
    from diffusers import FluxPipeline

    from branchgrpo.diffusers import flux

    clip_tokenizer, t5_tokenizer, clip_vocab, t5_vocab = _tokenizers()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        encoder, encoder_2 = _text_encoders(clip_vocab, t5_vocab, hidden=32, projection=None)
        vae = _vae()
    base = flux.tiny_pipeline(seed=1)
    pipeline = FluxPipeline(
        transformer=base.transformer, scheduler=base.scheduler, vae=vae, text_encoder=encoder,
        tokenizer=clip_tokenizer, text_encoder_2=encoder_2, tokenizer_2=t5_tokenizer,
    )  # fmt: skip
    pipeline.save_pretrained(path)


MODELS = {"sd3-5": lambda path: _tiny_sd3(path), "flux1": lambda path: _tiny_flux(path)}


def _config(tmp_path: Path, trainer_type: str, model_type: str, reward: str = REWARD_NAME) -> Path:
    """Flow-Factory's YAML config for the run: 2 prompts, one tree each of 'branch' split at steps 0 and 2 (4
    leaves, 12 edges), Flow-SDE, 2 epochs, full fine-tuning in float32, the reward model ``reward``."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.txt").write_text("\n".join(PROMPTS) + "\n")
    config = {
        "launcher": "accelerate",
        "num_processes": 1,
        "mixed_precision": "no",
        "data": {
            "dataset_dir": str(data), "preprocessing_batch_size": 2, "dataloader_num_workers": 0,
            "force_reprocess": True, "cache_dir": str(tmp_path / "cache"), "sampler_type": "auto",
        },
        "model": {
            "finetune_type": "full", "model_name_or_path": str(tmp_path / "model"), "model_type": model_type,
            "master_weight_dtype": "fp32", "target_modules": "all",
        },
        "log": {"run_name": "tree", "logging_backend": "none", "save_dir": str(tmp_path / "saves"), "save_freq": 0,
                "verbose": False},
        "train": {
            "trainer_type": trainer_type, "tree_method": "branch", "tree_split_steps": [0, 2], "tree_branching": [2],
            "tree_max_batch": 8, "resolution": 16, "num_inference_steps": STEPS, "guidance_scale": 1.0,
            "per_device_batch_size": 2, "group_size": 1, "unique_sample_num_per_epoch": 2,
            "gradient_step_per_epoch": 1, "max_epochs": 2, "learning_rate": 1.0e-3, "clip_range": 0.2,
            "adv_clip_range": 5.0, "kl_beta": 0, "ref_param_device": "cpu", "ema_decay": 0, "ema_device": "cpu",
            "latent_storage_dtype": "fp32", "seed": 3,
        },
        "scheduler": {"dynamics_type": "Flow-SDE", "noise_level": 0.7, "seed": 42},
        "eval": {"eval_freq": 0, "resolution": 16, "num_inference_steps": STEPS},
        "rewards": [{"name": "redness", "reward_model": reward, "batch_size": 8, "device": "cpu",
                     "dtype": "float32"}],
    }  # fmt: skip
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _parameters(trainer: Any) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.adapter.get_trainable_parameters()]


@pytest.mark.parametrize("model_type", sorted(MODELS))
def test_flow_factory_loop_trains_trees(tmp_path: Path, model_type: str) -> None:
    _flow_factory_on_path()
    _register_reward()
    MODELS[model_type](tmp_path / "model")
    from flow_factory.hparams import Arguments
    from flow_factory.hparams.training_args import _TRAINING_ARGS_REGISTRY, get_training_args_class
    from flow_factory.trainers.grpo import GRPOTrainer
    from flow_factory.trainers.loader import load_trainer
    from flow_factory.trainers.registry import _TRAINER_REGISTRY, get_trainer_class

    import branchgrpo

    # The CLI's trainer_type resolves through Flow-Factory's own lookup, which imports the module and registers it.
    path = _config(tmp_path, "branchgrpo.flow_factory.BranchGRPO", model_type)
    config = Arguments.load_from_yaml(str(path))
    from branchgrpo import flow_factory as bff

    assert type(config.training_args) is bff.BranchGRPOTrainingArguments
    for name in (bff.TRAINER_NAME, bff.TRAINER_TYPE):
        assert name.lower() in _TRAINER_REGISTRY and name.lower() in _TRAINING_ARGS_REGISTRY
        assert get_trainer_class(name) is bff.BranchGRPOTrainer
        assert get_training_args_class(name) is bff.BranchGRPOTrainingArguments
    assert issubclass(bff.BranchGRPOTrainer, GRPOTrainer)
    train = yaml.safe_load(path.read_text())["train"]
    with pytest.raises(ValueError, match=r"^train.tree_method = 'branch' with its options: .*branching"):
        bff.BranchGRPOTrainingArguments.from_dict(dict(train, tree_branching=[0]))
    with pytest.raises(ValueError, match=r"^train.group_size = 4: must be 1"):
        bff.BranchGRPOTrainingArguments.from_dict(dict(train, group_size=4))
    with pytest.raises(ValueError, match=r"^train.tree_methd: unknown key"):
        bff.BranchGRPOTrainingArguments.from_dict(dict(train, tree_methd="dance"))

    trainer = load_trainer(config)
    assert type(trainer) is bff.BranchGRPOTrainer
    epochs: list[dict[str, Any]] = []
    optimize = trainer.optimize

    def recorded_optimize(samples: list[Any]) -> None:
        before = _parameters(trainer)
        record = {
            "epoch": trainer.epoch,
            "leaves": list(samples),
            "edges": list(trainer.edge_samples),
            "rollout": trainer.tree_rollout,
            "rewards": np.asarray(trainer.tree_rewards, dtype=np.float64),
            "ratio_gap": _first_ratio_gap(trainer),
        }
        optimize(samples)
        record["moved"] = max(float((a - b).abs().max()) for a, b in zip(before, _parameters(trainer), strict=True))
        epochs.append(record)

    trainer.optimize = recorded_optimize
    trainer.start()

    assert trainer.epoch == 2 and [r["epoch"] for r in epochs] == [0, 1]
    timesteps = trainer.adapter.scheduler.timesteps
    for record in epochs:
        result, leaves, edges = record["rollout"], record["leaves"], record["edges"]
        tree = result.tree
        assert tree.tree_count == 2 and tree.leaves.shape == (8,)
        # The rewards are Flow-Factory's reward model on the decoded leaves, in the engine's leaf order.
        images = torch.stack([s.image for s in leaves]).float()
        assert np.allclose(record["rewards"], _redness(images).numpy(), atol=1e-6)
        assert [s.extra_kwargs["branchgrpo_node"] for s in leaves] == tree.leaves.tolist()
        # The advantages are the engine's credit on those rewards: per trained edge, and each leaf's edge.
        credit = branchgrpo.credit(result, record["rewards"], iteration=record["epoch"], total_iterations=2)
        nodes = [s.extra_kwargs["branchgrpo_node"] for s in edges]
        assert nodes == credit.trained.tolist() and len(edges) == 24
        got = np.array([float(s.extra_kwargs["advantage"]) for s in edges])
        assert np.array_equal(got, credit.edge_advantage[nodes])
        leaf_advantage = np.array([float(s.extra_kwargs["advantage"]) for s in leaves])
        assert np.array_equal(leaf_advantage, credit.edge_advantage[tree.leaves])
        assert np.abs(got).max() > 0.1  # depth-wise normalized: not all zero
        _check_tree(tree, edges, timesteps)
        # Flow-Factory's log-prob of each engine transition is the engine's own (same Flow-SDE), and its forward in
        # optimize gives the recorded one (the first ratio is 1).
        ff = np.array([float(s.log_probs[0]) for s in edges])
        engine = np.array([s.extra_kwargs["branchgrpo_log_prob"] for s in edges])
        assert np.allclose(ff, engine, rtol=1e-3, atol=1e-3), np.abs(ff - engine).max()
        assert record["ratio_gap"] < 1e-3, record["ratio_gap"]
        assert record["moved"] > 0
    first, second = (torch.stack([s.all_latents[1] for s in r["edges"]]) for r in epochs)
    assert not torch.equal(first, second)  # epoch-keyed noise and updated weights


def test_flow_factory_cli_runs_the_tree_trainer(tmp_path: Path) -> None:
    """Flow-Factory's own CLI (flow_factory.cli, which launches ``python -m flow_factory.train`` for one process)
    on a config whose trainer_type is TRAINER_TYPE: a fresh interpreter finds the trainer through Flow-Factory's
    lookups alone and runs 2 epochs of trees (the reward is Flow-Factory's example model, all zeros)."""
    _flow_factory_on_path()
    _tiny_sd3(tmp_path / "model")
    reward = "flow_factory.rewards.my_reward.MyPointwiseRewardModel"
    config = _config(tmp_path, "branchgrpo.flow_factory.BranchGRPO", "sd3-5", reward)
    source = str(Path(CHECKOUT) / "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run(
        [sys.executable, "-m", "flow_factory.cli", str(config)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "Registered trainer: branchgrpo -> BranchGRPOTrainer" in log
    epochs = re.findall(r"Epoch (\d+)\] train/reward_mean=0\S* train/tree_leaves=8 train/tree_edges=24", log)
    assert epochs == ["000", "001"], log[-4000:]
    assert "Training completed successfully" in log


def _check_tree(tree: Any, edges: list[Any], timesteps: torch.Tensor) -> None:
    """The edge samples are the tree: each edge starts where its parent edge ended, siblings share their start and
    differ after the split, two leaves' paths are equal up to their common ancestor's step and differ after it,
    and each edge's timesteps are the scheduler's at its step."""
    by_node = {s.extra_kwargs["branchgrpo_node"]: s for s in edges}
    padded = torch.cat([timesteps, timesteps.new_zeros(1)])
    children: dict[int, list[int]] = {}
    for node, sample in by_node.items():
        parent, step = sample.extra_kwargs["branchgrpo_parent"], sample.extra_kwargs["branchgrpo_step"]
        assert parent == int(tree.parent[node]) and step == int(tree.step[parent])
        assert torch.equal(sample.timesteps, padded[step : step + 2])
        children.setdefault(parent, []).append(node)
        if parent in by_node:
            assert torch.equal(sample.all_latents[0], by_node[parent].all_latents[1])
    for siblings in children.values():
        starts = [by_node[n].all_latents[0] for n in siblings]
        assert all(torch.equal(starts[0], s) for s in starts)
        ends = [by_node[n].all_latents[1] for n in siblings]
        assert all(not torch.equal(ends[0], e) for e in ends[1:])

    def path(leaf: int) -> list[torch.Tensor]:
        nodes = [leaf]
        while int(tree.parent[nodes[-1]]) >= 0:
            nodes.append(int(tree.parent[nodes[-1]]))
        nodes.reverse()
        return [by_node[nodes[1]].all_latents[0]] + [by_node[n].all_latents[1] for n in nodes[1:]]

    def ancestors(node: int) -> list[int]:
        out = [node]
        while int(tree.parent[out[-1]]) >= 0:
            out.append(int(tree.parent[out[-1]]))
        return out

    leaves = tree.leaves.tolist()
    compared = 0
    for i, a in enumerate(leaves):
        for b in leaves[i + 1 :]:
            common = [n for n in ancestors(a) if n in set(ancestors(b))]
            if not common:
                continue  # different trees
            split = int(tree.step[common[0]])
            pa, pb = path(a), path(b)
            assert all(torch.equal(x, y) for x, y in zip(pa[: split + 1], pb[: split + 1], strict=True))
            assert all(not torch.equal(x, y) for x, y in zip(pa[split + 1 :], pb[split + 1 :], strict=True))
            compared += 1
    assert compared == 12  # 6 pairs in each of the 2 trees


def _first_ratio_gap(trainer: Any) -> float:
    """The largest |log-prob - recorded log-prob| when the adapter's forward scores the first edges with
    next_latents, its inputs assembled as Flow-Factory's GRPO optimize assembles them, before any update."""
    from flow_factory.utils.base import filter_kwargs

    samples = trainer.edge_samples[:4]
    batch = type(samples[0]).stack(samples)
    inputs = {
        **trainer.training_args,
        "t": batch["timesteps"][:, 0],
        "t_next": batch["timesteps"][:, 1],
        "latents": batch["all_latents"][:, 0],
        "next_latents": batch["all_latents"][:, 1],
        "compute_log_prob": True,
        "noise_level": trainer.adapter.scheduler.noise_level,
        **batch,
        "return_kwargs": ["log_prob"],
    }
    with torch.no_grad(), trainer.autocast():
        out = trainer.adapter.forward(**filter_kwargs(trainer.adapter.forward, **inputs))
    return float((out.log_prob.float() - batch["log_probs"][:, 0].float()).abs().max())
