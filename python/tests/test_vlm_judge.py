"""branchgrpo.vlm_judge against tests/rewards/fake_openai_server.py (the C++ judge's fake server): the exact scores of
images whose answers the server derives from their red channel, a clip's middle frame, a non-finite leaf, the
question sent, and each failure as one line."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from branchgrpo.vlm_judge import VLMJudge

SERVER = Path(__file__).resolve().parents[2] / "tests" / "rewards" / "fake_openai_server.py"
MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"


def start(tmp_path: Path, fault: str = "") -> tuple[subprocess.Popen, str]:
    port_file = tmp_path / f"port{fault}"
    command = [sys.executable, str(SERVER), "--model", MODEL, "--port-file", str(port_file)]
    command += ["--log", str(tmp_path / "log.jsonl")] + (["--fault", fault] if fault else [])
    process = subprocess.Popen(command)
    for _ in range(200):
        if port_file.exists():
            return process, f"http://127.0.0.1:{port_file.read_text().strip()}"
        time.sleep(0.05)
    process.kill()
    raise RuntimeError("the fake server did not start")


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[str]:
    process, url = start(tmp_path)
    yield url
    process.kill()
    process.wait()


def expected(red_byte: int) -> float:
    """The fake server's score of an image whose red channel is ``red_byte`` everywhere: (0.05 + 0.8 r) / 0.9."""
    return (0.05 + 0.8 * red_byte / 255) / 0.9


def test_scores_follow_the_image_and_the_question_names_the_prompt(server: str, tmp_path: Path) -> None:
    judge = VLMJudge(server, MODEL, top_logprobs=4)
    images = torch.full((3, 3, 4, 6), -1.0)
    images[0, 0] = 1.0  # red 255
    images[2, 0] = 0.0  # red round(127.5) = 128
    scores = judge(images, ["a red circle", "a black square", "a dim one"])
    assert scores == pytest.approx([expected(255), expected(0), expected(128)], abs=1e-12)
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [entry["question"] for entry in log][0] == "Does this image show a red circle? Answer yes or no."
    assert (log[0]["width"], log[0]["height"]) == (6, 4)


def test_a_clip_is_judged_by_its_middle_frame_and_a_non_finite_leaf_is_not_sent(server: str, tmp_path: Path) -> None:
    judge = VLMJudge(server, MODEL)
    clips = torch.full((2, 5, 3, 2, 2), -1.0)
    clips[0, 2, 0] = 1.0  # only the middle frame (5 // 2) is red
    clips[1, 0, 0, 0, 0] = math.nan
    scores = judge(clips, ["a", "b"])
    assert scores[0] == pytest.approx(expected(255), abs=1e-12) and math.isnan(scores[1])
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("neither", 'neither yes nor no among the first token\'s 2 top_logprobs: "Maybe" -0.693147, "The" -1.20'),
        ("no-logprobs", "the answer has no choices[0].logprobs.content[0].top_logprobs (does the server return"),
        ("http-500", "HTTP 500: fake failure (after 2 attempts)"),
        ("garbage", "(after 2 attempts)"),
    ],
)
def test_a_failed_answer_is_one_line_after_the_retries(tmp_path: Path, fault: str, message: str) -> None:
    process, url = start(tmp_path, fault)
    try:
        judge = VLMJudge(url, MODEL, retries=1, backoff=0.0)
        with pytest.raises(RuntimeError) as error:
            judge(torch.zeros(1, 3, 2, 2), ["a"])
        assert str(error.value).startswith(f"vlm judge {url}/v1/chat/completions: ")
        assert message in str(error.value) and "\n" not in str(error.value)
    finally:
        process.kill()
        process.wait()


def test_an_unknown_model_and_a_dead_server_are_refused_at_start(server: str) -> None:
    with pytest.raises(ValueError, match=rf"^vlm judge: model = 'other': {server} serves {MODEL}$"):
        VLMJudge(server, "other")
    with pytest.raises(RuntimeError, match=r"^vlm judge http://127.0.0.1:9/v1/models: not reachable \("):
        VLMJudge("http://127.0.0.1:9", MODEL)
    with pytest.raises(ValueError, match=r"^vlm judge: top_logprobs = 21: must be an integer in \[1, 20\]$"):
        VLMJudge(server, MODEL, top_logprobs=21)
    with pytest.raises(ValueError, match=r"^vlm judge: images of shape \(2, 1, 2, 2\) and 2 prompts: needs"):
        VLMJudge(server, MODEL)(torch.zeros(2, 1, 2, 2), ["a", "b"])
