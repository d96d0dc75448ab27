"""examples/python/train.py on the tiny diffusers pipelines (docs/python.md, "Training a diffusers model"): LoRA runs
of every family, held-out evaluation with its grids and TensorBoard scalars, the VLM judge as reward, a resumed run
equal to an uninterrupted one bit for bit, DDP under accelerate launch and FSDP2 under torchrun on two gloo
processes, a remote reward, the saved LoRA loaded by the pipeline's ``load_lora_weights``, and bad input as one line
each."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from branchgrpo import diffusers as adapters
from branchgrpo.diffusers import families, flux, sd3

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "python" / "train.py"
spec = importlib.util.spec_from_file_location("train_script", SCRIPT)
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)

REWARD = "def score(images, prompts):\n    return -(images - 0.3).square().flatten(1).mean(1)\n"
# dance on 4 steps: 16 leaves and 64 trained edges per prompt; 32 x 32 pixels are 4 x 4 latents.
SMALL = ["--tiny", "--method", "dance", "--steps", "4", "--height", "32", "--width", "32", "--reward", "reward:score"]


@pytest.fixture()
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "reward.py").write_text(REWARD)
    (tmp_path / "prompts.txt").write_text("a red circle\na blue square\n\na green triangle\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def run(*arguments: str, model: str = "flux", output: str = "out", iterations: int = 2) -> list[dict]:
    options = ["--model", model, *SMALL, "--prompts", "prompts.txt", "--output", output]
    train.main([*options, "--iterations", str(iterations), "--prompts-per-iteration", "2", *arguments])
    return [json.loads(line) for line in Path(output, "metrics.jsonl").read_text().splitlines()]


def checkpoint(output: str, iteration: int) -> dict:
    return torch.load(Path(output, "checkpoints", f"iteration-{iteration:06d}.pt"), weights_only=True)


def assert_lora_loads(pipeline, folder: Path, second_expert: bool = False) -> None:
    """The saved LoRA loads with ``load_lora_weights`` (Wan2.2 A14B's second expert's into ``transformer_2``) and
    holds the trained weights."""
    saved = load_file(folder / "pytorch_lora_weights.safetensors")
    pipeline.load_lora_weights(str(folder), **({"load_into_transformer_2": True} if second_expert else {}))
    expert = pipeline.transformer_2 if second_expert else pipeline.transformer
    loaded = {n: p for n, p in expert.named_parameters() if "lora" in n}
    assert len(loaded) == len(saved) > 0
    for key, value in saved.items():
        name = key.removeprefix("transformer.").replace(".weight", ".default_0.weight")
        assert torch.equal(loaded[name], value), key
    assert any(k.endswith("lora_B.weight") and v.abs().max() > 0 for k, v in saved.items())  # it trained


def test_two_sd3_lora_iterations_and_the_lora_loads(folder: Path) -> None:
    rows = run(model="sd3")
    assert [r["iteration"] for r in rows] == [1, 2] and all(r["edges_trained"] == 128 for r in rows)
    assert_lora_loads(sd3.tiny_pipeline(), folder / "out" / "lora")


@pytest.mark.parametrize(
    ("model", "variant", "extra"),
    [
        ("wan", None, ["--num-frames", "5"]),
        ("wan", "a14b", ["--guidance-scale", "1"]),  # the two experts, each with its LoRA
        ("wan", "ti2v", []),
        ("qwenimage", None, []),
        ("flux2", None, []),
        ("flux2", "klein-base", []),  # CFG with the negative prompt ""
    ],
)
def test_two_lora_iterations_of_every_family(folder: Path, model: str, variant: str | None, extra: list) -> None:
    rows = run(*extra, *(["--tiny-variant", variant] if variant else []), model=model)
    assert [r["iteration"] for r in rows] == [1, 2] and all(r["edges_trained"] == 128 for r in rows)
    assert all(math.isfinite(r["loss"]) for r in rows)
    family = getattr(adapters, model)
    pipeline = lambda: family.tiny_pipeline(0, **({"variant": variant} if variant else {}))  # noqa: E731
    assert_lora_loads(pipeline(), folder / "out" / "lora")
    if variant == "a14b":
        assert_lora_loads(pipeline(), folder / "out" / "lora_2", second_expert=True)


def test_held_out_evaluation_writes_grids_and_tensorboard_scalars(folder: Path) -> None:
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (folder / "held_out.txt").write_text("a yellow star\na purple moon\na grey cloud\n")
    run("--eval-prompts", "held_out.txt", "--eval-every", "2", iterations=3, model="sd3")
    evaluations = [json.loads(line) for line in (folder / "out" / "eval.jsonl").read_text().splitlines()]
    assert [e["iteration"] for e in evaluations] == [0, 2, 3]  # the start, every 2, the end
    assert all(len(e["eval_rewards"]) == 3 for e in evaluations)
    assert evaluations[0]["eval_rewards"] != evaluations[2]["eval_rewards"]  # the weights changed the samples
    with Image.open(folder / "out" / "eval" / "iteration-000002.png") as grid:
        assert grid.size == (3 * 4, 4) and grid.mode == "RGB"  # three 4 x 4 latent "images" side by side
    events = EventAccumulator(str(folder / "out" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("reward_mean")] == [1, 2, 3]
    assert [round(e.value, 5) for e in events.Scalars("eval_reward_mean")] == [
        round(e["eval_reward_mean"], 5) for e in evaluations
    ]
    assert [e.step for e in events.Images("eval")] == [0, 2, 3]


def test_a_vlm_judge_reward(folder: Path) -> None:
    port_file = folder / "port"
    server = ROOT / "tests" / "rewards" / "fake_openai_server.py"
    command = [sys.executable, str(server), "--model", "judge", "--port-file", str(port_file)]
    process = subprocess.Popen([*command, "--log", str(folder / "judged.jsonl")])
    try:
        for _ in range(200):
            if port_file.exists():
                break
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port_file.read_text().strip()}"
        options = ["--model", "flux", *SMALL[:-2], "--prompts", "prompts.txt", "--output", "out"]
        train.main(
            [*options, "--vlm-judge", url, "--vlm-model", "judge", "--iterations", "1", "--prompts-per-iteration", "2"]
        )
    finally:
        process.kill()
        process.wait()
    judged = [json.loads(line) for line in (folder / "judged.jsonl").read_text().splitlines()]
    assert len(judged) == 2 * 16  # dance on 4 steps: 16 leaves per prompt, one question each
    assert judged[0]["question"] == "Does this image show a red circle? Answer yes or no."
    (row,) = [json.loads(line) for line in (folder / "out" / "metrics.jsonl").read_text().splitlines()]
    mean = sum((0.05 + 0.8 * j["red"]) / 0.9 for j in judged) / len(judged)
    assert row["reward_mean"] == pytest.approx(mean, abs=1e-9)


def test_flux_resumed_equals_uninterrupted_and_the_lora_loads(folder: Path) -> None:
    rows = run("--checkpoint-every", "1", output="straight")
    assert [r["iteration"] for r in rows] == [1, 2] and all(r["edges_trained"] == 128 for r in rows)
    run("--checkpoint-every", "1", output="first", iterations=1)
    run("--resume", "first/checkpoints/iteration-000001.pt", output="resumed")
    straight, resumed = checkpoint("straight", 2), checkpoint("resumed", 2)
    assert straight["trainer"]["iteration"] == resumed["trainer"]["iteration"] == 2
    for name, value in straight["model"].items():
        assert torch.equal(value, resumed["model"][name]), name
    a = load_file(folder / "straight" / "lora" / "pytorch_lora_weights.safetensors")
    b = load_file(folder / "resumed" / "lora" / "pytorch_lora_weights.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert_lora_loads(flux.tiny_pipeline(), folder / "straight" / "lora")


def test_ddp_on_two_gloo_processes_under_accelerate_launch(folder: Path) -> None:
    accelerate = [str(Path(sys.executable).parent / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2"]
    accelerate += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]  # gloo on the CPU
    options = ["--model", "flux", *SMALL, "--prompts", "prompts.txt", "--iterations", "1"]
    command = [*accelerate, str(SCRIPT), *options]
    environment = {**os.environ, "PYTHONPATH": str(folder), "OMP_NUM_THREADS": "1"}
    # 3 prompts on 2 ranks: rank 0 rolls out 2 trees, rank 1 one (DDP's padding calls).
    done = subprocess.run([*command, "--prompts-per-iteration", "3", "--output", "two"], env=environment, timeout=120)
    assert done.returncode == 0
    run("--prompts-per-iteration", "3", output="one", iterations=1)
    one, two = checkpoint("one", 1), checkpoint("two", 1)
    for name, value in one["model"].items():
        assert torch.allclose(value, two["model"][name], rtol=0, atol=1e-6), name
    assert_lora_loads(flux.tiny_pipeline(), folder / "two" / "lora")


def test_fsdp2_on_two_gloo_processes_equals_one_and_resumes_exactly(folder: Path) -> None:
    torchrun = Path(sys.executable).parent / "torchrun"
    options = ["--model", "flux", *SMALL, "--prompts", "prompts.txt", "--prompts-per-iteration", "3", "--fsdp"]
    command = [str(torchrun), "--standalone", "--nproc_per_node", "2", str(SCRIPT), *options, "--checkpoint-every", "1"]
    environment = {**os.environ, "PYTHONPATH": str(folder), "OMP_NUM_THREADS": "1"}
    (folder / "held_out.txt").write_text("a yellow star\n")  # evaluated on rank 0 between sharded iterations
    straight = ["--eval-prompts", "held_out.txt", "--iterations", "2", "--output", "straight"]
    assert subprocess.run([*command, *straight], env=environment).returncode == 0
    resume = ["--resume", "straight/checkpoints/iteration-000001.pt", "--iterations", "2", "--output", "resumed"]
    assert subprocess.run([*command, *resume], env=environment).returncode == 0
    run("--prompts-per-iteration", "3", output="one")  # one process, no FSDP
    one, straight, resumed = checkpoint("one", 2), checkpoint("straight", 2), checkpoint("resumed", 2)
    assert straight["fsdp"] and sorted(straight["model"]) == sorted(one["model"])
    for name, value in one["model"].items():
        assert torch.allclose(value, straight["model"][name], rtol=0, atol=1e-6), name
        assert torch.equal(straight["model"][name], resumed["model"][name]), name
    assert len((folder / "straight" / "eval.jsonl").read_text().splitlines()) == 2  # iterations 0 and 2
    assert_lora_loads(flux.tiny_pipeline(), folder / "straight" / "lora")


def test_wan22_experts_on_two_gloo_processes_equal_one(folder: Path) -> None:
    """A14B's two experts train unwrapped, their gradients summed over the ranks by the Trainer."""
    torchrun = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node", "2"]
    options = ["--model", "wan", *SMALL, "--prompts", "prompts.txt", "--tiny-variant", "a14b", "--guidance-scale", "1"]
    options += ["--iterations", "1", "--prompts-per-iteration", "3"]
    environment = {**os.environ, "PYTHONPATH": str(folder), "OMP_NUM_THREADS": "1"}
    assert subprocess.run([*torchrun, str(SCRIPT), *options, "--output", "two"], env=environment).returncode == 0
    train.main([*options, "--output", "one"])
    one, two = checkpoint("one", 1), checkpoint("two", 1)
    assert any(name.startswith("low.") for name in one["model"]) and sorted(one["model"]) == sorted(two["model"])
    for name, value in one["model"].items():
        assert torch.allclose(value, two["model"][name], rtol=0, atol=1e-6), name
    with pytest.raises(SystemExit):
        train.main([*options, "--output", "sharded", "--fsdp"])


def test_a_remote_reward(folder: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import python_flux_side_by_side as side

    with side.reward_server(folder) as url:
        options = ["--model", "flux", *SMALL[:-2], "--prompts", "prompts.txt", "--output", "out"]
        train.main([*options, "--reward-server", url, "--iterations", "1", "--prompts-per-iteration", "1"])
    (row,) = [json.loads(line) for line in (folder / "out" / "metrics.jsonl").read_text().splitlines()]
    assert row["edges_trained"] == 64


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--model": "sdxl"}, f"--model 'sdxl': unknown (known: {', '.join(families())})"),
        ({"--lora-targets": "to_q,attn_qkv"}, "--lora-targets attn_qkv: the FluxTransformer2DModel has no module"),
        ({"--prompts": "missing.txt"}, "--prompts missing.txt: cannot read it"),
        ({"--prompts": "negative.jsonl"}, "flux: a negative prompt was given, but FLUX.1 has no classifier-free"),
        ({"--reward": None, "--reward-server": "http://127.0.0.1:9"}, "--reward-server http://127.0.0.1:9: not reach"),
        ({"--reward": None, "--vlm-judge": "http://127.0.0.1:9", "--vlm-model": "m"}, "--vlm-judge http://127.0.0.1:9"),
        ({"--height": "36"}, "flux: height = 36: must be a positive multiple of 16"),
        ({"--eval-prompts": "missing.txt"}, "--prompts missing.txt: cannot read it"),
        ({"--tiny-variant": "a14b"}, "--tiny-variant 'a14b': flux's variants are none"),
        ({"--model": "flux2", "--prompts": "negative.jsonl"}, "flux2: a negative prompt was given, but FLUX.2 [dev]"),
    ],
)
def test_bad_input_is_one_line_naming_the_value(folder: Path, capsys, change: dict, message: str) -> None:
    (folder / "negative.jsonl").write_text('{"prompt": "a cat", "negative_prompt": "blurry"}\n')
    options = {"--model": "flux", "--prompts": "prompts.txt", "--output": "out", "--reward": "reward:score"}
    options.update(change)
    arguments = [*SMALL[:-2], "--iterations", "1"]
    arguments += [item for flag, value in options.items() if value is not None for item in (flag, value)]
    with pytest.raises(SystemExit) as exit_:
        train.main(arguments)
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in error, error
