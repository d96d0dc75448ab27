"""Trainer: the C++ trainer driving a Python policy (update way (a)), held to way (b)'s stages, to itself resumed,
and to itself on two gloo processes."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile

import pytest
import torch

import branchgrpo
from branchgrpo import Method, Policy, Trainer

SMALL = {"topology": {"split_steps": [0, 2, 4], "branching": [2]}}  # 8 leaves over 8 steps


class Affine(torch.nn.Module):
    """v = W x + b per element row (a flattened latent), float64."""

    def __init__(self, size: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(size, size, dtype=torch.float64)
        with torch.no_grad():
            self.linear.weight.mul_(0.1).sub_(0.5 * torch.eye(size, dtype=torch.float64))

    def forward(self, x, sigma=None, step=None, prompts=None, trees=None):
        return self.linear(x.flatten(1)).view_as(x)


def reward(leaves, prompts):
    return -(leaves.flatten(1) - 0.3).square().sum(1) + 0.1 * prompts


def trainer_for(model, method="branch", optimizer=None, **options) -> Trainer:
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.05)
    policy = Policy(model, optimizer, reference=options.pop("reference", None))
    options.setdefault("steps", 8)
    sections = options.pop("sections", SMALL)
    return Trainer(
        policy, reward, latent_shape=[2, 2], method=Method(method, **sections), dtype=torch.float64, **options
    )


def test_way_a_is_way_b_for_ppo() -> None:
    a_model, b_model = Affine(4), Affine(4)
    stats = trainer_for(a_model, seed=5).step([0, 1])
    assert stats["edges_trained"] == 2 * 44 and stats["first_update_log_prob_gap"] == 0.0

    # Way (b): the stages in a user's loop, the whole loss in one backward pass.
    result = branchgrpo.rollout(
        b_model,
        method=Method("branch", **SMALL),
        prompts=[0, 1],
        latent_shape=[2, 2],
        steps=8,
        seed=5,
        dtype=torch.float64,
    )
    credit = branchgrpo.credit(result, branchgrpo.score(result, reward))
    edges = branchgrpo.edges(result, credit)
    loss = branchgrpo.ppo_loss(branchgrpo.transition_log_prob(edges, b_model(edges.latent)), edges)
    loss.backward()
    torch.optim.SGD(b_model.parameters(), lr=0.05).step()
    assert abs(stats["loss"] - float(loss.detach())) < 1e-12
    for a, b in zip(a_model.parameters(), b_model.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-13)
    assert not torch.equal(a_model.linear.weight, Affine(4).linear.weight)  # it trained


@pytest.mark.parametrize(
    ("method", "loss", "reference"),
    [
        ("dance", {}, False),
        ("branch-mix", {"ratio_norm": True}, False),
        ("branch", {"step_weight": "inverse_dt"}, False),
        ("branch", {"kl_beta": 0.1}, True),
        ("branch-nft", {}, False),
        ("branch-awm", {}, False),
    ],
)
def test_every_objective_trains_the_torch_model(method, loss, reference) -> None:
    model = Affine(4)
    before = model.linear.weight.detach().clone()
    sections = {} if method == "dance" else SMALL
    options = {"loss": loss, "sections": sections, "steps": 8, "updates_per_iteration": 2, "max_batch": 5}
    if reference:
        frozen = Affine(4)
        with torch.no_grad():
            frozen.linear.bias.add_(0.2)
        options["reference"] = frozen
    trainer = trainer_for(model, method, **options)
    stats = trainer.step([0, 1, 2])
    assert stats["edges_trained"] > 0 and stats["update_evaluations"] >= stats["edges_trained"]
    assert all(torch.isfinite(torch.tensor(v)) for v in stats.values())
    assert not torch.equal(model.linear.weight, before)
    assert (stats["kl"] > 0) == reference
    parts = ("sample", "reference", "forward", "backward", "optimizer", "score")
    assert stats["forward_seconds"] > 0 and stats["backward_seconds"] > 0 and stats["engine_seconds"] > 0
    assert (stats["reference_seconds"] > 0) == reference
    assert abs(sum(stats[f"{p}_seconds"] for p in parts) + stats["engine_seconds"] - stats["seconds"]) < 1e-9


@pytest.mark.parametrize(("kl_threshold", "masked"), [(1e-30, True), (1e9, False)])
def test_flow_dppo_masks_second_step_edges_by_the_step_kl(kl_threshold: float, masked: bool) -> None:
    model = Affine(4)
    before = model.linear.weight.detach().clone()
    sections = {**SMALL, "objective": {"kind": "dppo", "kl_threshold": kl_threshold}}
    trainer = trainer_for(model, "branch", sections=sections, steps=8, updates_per_iteration=2, max_batch=5)
    stats = trainer.step([0, 1, 2])
    assert (stats["clip_fraction"] > 0) == masked and stats["clip_fraction"] <= 0.5  # first-step edges: never
    assert not torch.equal(model.linear.weight, before)


def run_iterations(count: int, state: bytes | None = None) -> tuple[torch.nn.Module, bytes]:
    model = Affine(4)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    sections = {**SMALL, "advantage": {"kind": "per_prompt_running", "history": 64}}
    trainer = trainer_for(model, optimizer=optimizer, sections=sections, seed=9, total_iterations=4)
    if state is not None:
        saved = torch.load(io.BytesIO(state), weights_only=True)
        trainer.load_state_dict(saved["trainer"])
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
    for _ in range(count):
        trainer.step([0, 1])
    out = io.BytesIO()
    torch.save({"trainer": trainer.state_dict(), "model": model.state_dict(), "optimizer": optimizer.state_dict()}, out)
    return model, out.getvalue()


def test_a_resumed_run_equals_an_uninterrupted_one() -> None:
    straight, _ = run_iterations(3)
    _, state = run_iterations(2)
    resumed, _ = run_iterations(1, state)
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)
    fresh, _ = run_iterations(1)
    assert not torch.equal(fresh.linear.weight, straight.linear.weight)


WORKER = """
import sys, torch, torch.distributed as dist
sys.path.insert(0, {tests!r})
from test_trainer import Affine, trainer_for
rank, size, init, mode, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
if size > 1:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
model = Affine(4)
velocity = model
if mode == "ddp" and size > 1:
    velocity = torch.nn.parallel.DistributedDataParallel(model)
from branchgrpo import Method, Policy, Trainer
from test_trainer import SMALL, reward
policy = Policy(velocity, torch.optim.SGD(model.parameters(), lr=0.05), sample_velocity=model,
                gradients="averaged" if mode == "ddp" else "sum")
trainer = Trainer(policy, reward, latent_shape=[2, 2], method=Method("branch", **SMALL), steps=8,
                  dtype=torch.float64, max_batch=6, updates_per_iteration=2, seed=3)
for _ in range(2):
    stats = trainer.step([0, 1, 2])
if rank == 0:
    torch.save({{"model": model.state_dict(), "loss": stats["loss"]}}, out)
if size > 1:
    # The DDP wrapper's reducer and gloo's threads wind down before the group goes: every rank here, then the
    # wrapper released, then the group destroyed.
    dist.barrier()
    del trainer, policy, velocity
    dist.barrier()
    dist.destroy_process_group()
"""


def run_processes(size: int, mode: str, folder: str) -> dict:
    out = os.path.join(folder, f"{mode}-{size}.pt")
    init = "file://" + os.path.join(folder, f"init-{mode}-{size}")
    code = WORKER.format(tests=os.path.dirname(__file__))
    workers = [subprocess.Popen([sys.executable, "-c", code, str(r), str(size), init, mode, out]) for r in range(size)]
    assert all(w.wait(timeout=120) == 0 for w in workers)
    return torch.load(out, weights_only=True)


@pytest.mark.parametrize("mode", ["sum", "ddp"])
def test_two_gloo_processes_end_where_one_ends(mode: str) -> None:
    # 3 trees on 2 ranks: rank 0 rolls out 1, rank 1 two; the DDP-wrapped model needs the padding calls.
    with tempfile.TemporaryDirectory() as folder:
        one = run_processes(1, mode, folder)
        two = run_processes(2, mode, folder)
    assert abs(one["loss"] - two["loss"]) < 1e-12
    for key, value in one["model"].items():
        assert torch.allclose(value, two["model"][key], rtol=0, atol=1e-12), key


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"loss": {"clip": 0.1}}, ValueError, "loss.clip: unknown key (loss has: clip_range, advantage_clip,"),
        ({"loss": {"kl_beta": 0.1}}, ValueError, "loss.kl_beta = 0.1: needs the policy's reference velocity"),
        ({"loss": {"clip_range": 2.0}}, ValueError, "loss.clip_range = 2.0: must be in (0, 1)"),
        ({"updates_per_iteration": 0}, ValueError, "Trainer: updates_per_iteration = 0: must be in [1,"),
        ({"latent_shape": [0]}, ValueError, "Trainer: latent_shape = [0]: every value must be at least 1"),
        ({"sigmas": [1.0, 0.5, 0.0]}, ValueError, "Trainer: sigmas has 3 values: must have steps + 1 = 9"),
    ],
)
def test_bad_trainer_settings_are_one_exception_naming_the_value(change, error, message) -> None:
    model = Affine(4)
    options = {"latent_shape": [2, 2], "steps": 8, "method": Method("branch", **SMALL), "dtype": torch.float64}
    options.update(change)
    with pytest.raises(error) as raised:
        Trainer(Policy(model, torch.optim.SGD(model.parameters(), lr=0.1)), reward, **options).step([0])
    assert str(raised.value).startswith(message), str(raised.value)


def test_the_trainer_runs_the_given_sigmas() -> None:
    linear_sigmas = branchgrpo.rollout(lambda x, *_: -x, prompts=[0], latent_shape=[1], method="dance", steps=8).sigmas
    linear, same = trainer_for(Affine(4), seed=2), trainer_for(Affine(4), seed=2, sigmas=linear_sigmas.tolist())
    linear.step([0, 1])
    same.step([0, 1])
    assert all(torch.equal(a, b) for a, b in zip(linear.policy.parameters, same.policy.parameters, strict=True))

    sigmas, seen, model = [1.0, 0.7, 0.45, 0.3, 0.2, 0.12, 0.06, 0.02, 0.0], [], Affine(4)

    def velocity(x, sigma, *rest):
        seen.append(sigma)
        return model(x)

    other = trainer_for(model, seed=2, sigmas=sigmas)
    other.policy.velocity = other.policy.sample_velocity = velocity
    other.step([0, 1])
    assert set(seen) == set(sigmas[:-1])  # the rollout's calls and the update's
    assert not torch.equal(model.linear.weight, linear.policy.parameters[0])


def test_a_bad_velocity_or_reward_during_training_names_where() -> None:
    model = Affine(4)
    calls = {"n": 0}

    def wrong_in_update(x, *rest):
        calls["n"] += 1
        return model(x) if torch.is_grad_enabled() is False else model(x)[:, :1]

    trainer = Trainer(
        Policy(wrong_in_update, torch.optim.SGD(model.parameters(), lr=0.1), sample_velocity=model),
        reward,
        latent_shape=[2, 2],
        steps=8,
        method=Method("branch", **SMALL),
        dtype=torch.float64,
    )
    with pytest.raises(ValueError, match=r"policy velocity at iteration 0, step \d+ \(\d+ rows\): returned shape"):
        trainer.step([0])
    short = trainer_for(Affine(4))
    short.reward = lambda leaves, prompts: leaves.sum((1, 2))[:3]
    with pytest.raises(ValueError, match="reward at iteration 0 returned 3 scores for 8 leaves"):
        short.step([0])


def test_an_exception_inside_training_reaches_the_caller_and_never_crashes() -> None:
    code = f"""
import torch, sys
sys.path.insert(0, {os.path.dirname(__file__)!r})
from test_trainer import Affine, trainer_for
model = Affine(4)
trainer = trainer_for(model)
def failing(leaves, prompts):
    raise KeyError("the user's own error")
trainer.reward = failing
try:
    trainer.step([0])
except KeyError as e:
    print("caught", e)
trainer.reward = lambda leaves, prompts: leaves.sum((1, 2))
print(trainer.step([0])["edges_trained"])
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["caught", '"the', "user's", "own", 'error"', "44"]


def test_the_trainer_takes_parts_and_win_rates() -> None:
    model = Affine(4)
    policy = Policy(model, torch.optim.SGD(model.parameters(), lr=0.05))

    def parts(leaves, prompts):
        return {"near": reward(leaves, prompts), "x": (0.5, leaves.flatten(1)[:, 0])}

    method = Method("branch", advantage={"per_reward": True}, **SMALL)
    trainer = Trainer(policy, parts, latent_shape=[2, 2], steps=8, method=method, dtype=torch.float64, win_rate=True)
    stats = trainer.step([0, 1])
    # Win rates of each part: each in [0, 1], so the weighted sum (1 + 0.5) has mean 0.75 over each tree.
    assert abs(stats["reward_mean"] - 0.75) < 1e-12 and stats["edges_trained"] == 88


def test_value_pruning_stops_the_lowest_valued_branches_during_the_rollout() -> None:
    # SMALL cut at its last split (step 4) keeping 2 of 4 nodes: each stopped node saves its 2 children's 3
    # evaluations (steps 5-7) and their 2 x 4 edges.
    pruned = {**SMALL, "pruning": {"pruners": [{"kind": "value", "keep": 2}]}}
    stats = trainer_for(Affine(4), seed=5, sections=pruned).step([0, 1])
    assert (stats["evaluations"], stats["evaluations_saved"]) == (2 * (37 - 12), 2 * 12)
    assert stats["edges_trained"] == 2 * (44 - 16)
    late = {**SMALL, "pruning": {"pruners": [{"kind": "value", "step": 6}]}}
    with pytest.raises(ValueError, match=r"^value pruning step = 6 is past the last split \(step 4\)"):
        trainer_for(Affine(4), sections=late).step([0])


def test_adaptive_branching_shapes_each_prompt_and_its_state_round_trips() -> None:
    # SMALL's envelope (splits 0, 2, 4 over 8 steps) costs 8, 11, 19, 37 evaluations at levels 0..3; a budget of 20
    # per prompt lets two unseen prompts reach level 2 each (38 of 40).
    adaptive = {"topology": {"kind": "adaptive_branching", "split_steps": [0, 2, 4], "budget": 20}}
    trainer = trainer_for(Affine(4), seed=5, sections=adaptive)
    stats = trainer.step([0, 1])
    assert stats["evaluations"] == 38
    state = trainer.method.state()
    assert sorted(state) == ["topology.prompt.0", "topology.prompt.1"]
    assert state["topology.prompt.0"][0] == 1.0  # visits
    again = Method("branch", **adaptive)
    again.load_state(state)
    assert again.state() == state
    with pytest.raises(ValueError, match=r"^adaptive_branching budget = 7 is below one chain per prompt \(8 eval"):
        trainer_for(Affine(4), sections={"topology": {**adaptive["topology"], "budget": 7}}).step([0])
