"""A vision-language model as a reward: the VLM judge of the C++ tool (docs/rewards.md, "VLM judge") for Python
trainers. Each leaf and its prompt become one yes/no question to a model served behind an OpenAI-compatible
chat-completions endpoint (vLLM's or SGLang's server), and the leaf scores how sure the model is of "yes":

    score = P(yes) / (P(yes) + P(no))      in [0, 1]

from the first answer token's ``top_logprobs``. Same request, same reading of the answer and same errors as the C++
client, so a run scores alike from either side.

>>> round(judge_score([{"token": "Yes", "logprob": math.log(0.6)}, {"token": "no", "logprob": math.log(0.2)},
...                    {"token": "Maybe", "logprob": math.log(0.1)}]), 12)
0.75
"""

from __future__ import annotations

import base64
import io
import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["VLMJudge", "judge_score", "png_bytes"]

DEFAULT_QUESTION = "Does this image show {prompt}? Answer yes or no."


def _word(token: str) -> str:
    """A token as the judge reads it: ASCII whitespace and a leading word marker removed, ASCII letters lower-cased.

    >>> _word(" Yes"), _word("\\u0120no"), _word("\\u2581YES"), _word("Yes.")
    ('yes', 'no', 'yes', 'yes.')
    """
    text = token.strip(" \t\n\r\f\v").removeprefix("\u0120").removeprefix("\u2581").strip(" \t\n\r\f\v")
    return "".join(c.lower() if c.isascii() else c for c in text)


def _log_sum_exp(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def judge_score(top_logprobs: Sequence[dict[str, Any]]) -> float | None:
    """The score of one answer from its first token's alternatives (each ``{"token", "logprob"}``): P(yes) over
    P(yes) + P(no), each the sum of exp(logprob) of the tokens that read so (``_word``), computed with log-sum-exp;
    1 when only yes tokens are listed, 0 when only no tokens; None when neither is (no score).

    >>> round(judge_score([{"token": "Yes", "logprob": math.log(0.3)}, {"token": " yes", "logprob": math.log(0.3)},
    ...                    {"token": "NO", "logprob": math.log(0.2)}]), 12)
    0.75
    >>> judge_score([{"token": "Yes", "logprob": -0.3}, {"token": "Sure", "logprob": -1.6}])
    1.0
    >>> judge_score([{"token": "Maybe", "logprob": -0.7}]) is None
    True
    """
    yes = [float(t["logprob"]) for t in top_logprobs if _word(str(t["token"])) == "yes"]
    no = [float(t["logprob"]) for t in top_logprobs if _word(str(t["token"])) == "no"]
    if not yes and not no:
        return None
    if not no:
        return 1.0
    if not yes:
        return 0.0
    return 1.0 / (1.0 + math.exp(_log_sum_exp(no) - _log_sum_exp(yes)))


def png_bytes(image: torch.Tensor) -> bytes:
    """An RGB image [3, H, W] with values in [-1, 1] as an 8-bit RGB PNG: byte = round(255 clamp((x + 1) / 2, 0, 1)).

    >>> data = png_bytes(torch.tensor([1.0, 0.0, -1.0]).view(3, 1, 1))
    >>> from PIL import Image
    >>> Image.open(io.BytesIO(data)).getpixel((0, 0))
    (255, 128, 0)
    """
    from PIL import Image

    pixels = ((image.detach().float().cpu() + 1) / 2).clamp(0, 1).mul(255).round().to(torch.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels.permute(1, 2, 0).contiguous().numpy(), "RGB").save(buffer, format="PNG")
    return buffer.getvalue()


class VLMJudge:
    """The judge as a reward callable: ``judge(images, prompts)`` -> one score per image, images [N, 3, H, W] with
    values in [-1, 1] (a video [N, F, 3, H, W]: each clip's middle frame F / 2, a still), prompts N strings.

    ``url`` is the server's root (``/v1/chat/completions`` is added; a url ending in ``/v1``, an OpenAI client's
    base_url, is refused), ``model`` the served model's name as ``GET /v1/models`` lists it (checked here, so a dead
    server or a wrong name is one line at start), ``question`` the template whose every ``{prompt}`` is the prompt
    text (required: without it every leaf would get the same question), ``top_logprobs`` in [1, 20]. A request that
    fails (no connection, a timeout, a non-200 status, a body that is not JSON, no logprobs, neither yes nor no) is
    retried ``retries`` times after ``backoff``, 2 ``backoff`` ... seconds, then one ``RuntimeError`` naming the url
    and quoting what came back. A leaf with a non-finite value is not sent and scores NaN.

    >>> VLMJudge("http://127.0.0.1:8000/v1", "m")
    Traceback (most recent call last):
    ValueError: vlm judge: url = 'http://127.0.0.1:8000/v1': give the server's root; the judge adds /v1/chat/completions
    >>> VLMJudge("http://127.0.0.1:8000", "m", question="Is this a cat?")
    Traceback (most recent call last):
    ValueError: vlm judge: question = 'Is this a cat?': has no {prompt} (every leaf would get the same question)
    """

    def __init__(
        self,
        url: str,
        model: str,
        *,
        question: str = DEFAULT_QUESTION,
        top_logprobs: int = 20,
        timeout: float = 60.0,
        retries: int = 2,
        backoff: float = 1.0,
    ) -> None:
        self.url = str(url).rstrip("/")
        if self.url.endswith("/v1"):
            raise ValueError(f"vlm judge: url = {url!r}: give the server's root; the judge adds /v1/chat/completions")
        if "{prompt}" not in question:
            raise ValueError(
                f"vlm judge: question = {question!r}: has no {{prompt}} (every leaf would get the same question)"
            )
        if not isinstance(top_logprobs, int) or not 1 <= top_logprobs <= 20:
            raise ValueError(f"vlm judge: top_logprobs = {top_logprobs!r}: must be an integer in [1, 20]")
        if not timeout > 0 or not isinstance(retries, int) or retries < 0 or not backoff >= 0:
            raise ValueError(
                f"vlm judge: timeout = {timeout!r}, retries = {retries!r}, backoff = {backoff!r}: need timeout > 0, "
                "retries an integer >= 0, backoff >= 0"
            )
        self.model, self.question, self.top_logprobs = model, question, top_logprobs
        self.timeout, self.retries, self.backoff = float(timeout), retries, float(backoff)
        self.endpoint = self.url + "/v1/chat/completions"
        try:
            served = [entry["id"] for entry in self._request(self.url + "/v1/models", None, 10.0)["data"]]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise RuntimeError(f"vlm judge {self.url}/v1/models: not reachable ({error})") from None
        if model not in served:
            raise ValueError(f"vlm judge: model = {model!r}: {self.url} serves {', '.join(served) or 'no model'}")

    def __repr__(self) -> str:
        return f"<VLMJudge {self.model} at {self.url}>"

    def _request(self, address: str, body: Any, timeout: float) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(address, data=data, method="GET" if body is None else "POST")
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as error:
            text = error.read().decode(errors="replace")
            try:
                message = json.loads(text)
                text = message.get("error", {}).get("message") or message.get("message") or text
            except (ValueError, AttributeError):
                pass
            raise ValueError(f"HTTP {error.code}: {text}") from None

    def _judge(self, image: torch.Tensor, prompt: str) -> float:
        url = "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode()
        text = self.question.replace("{prompt}", prompt)
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]
        body = {"model": self.model, "max_tokens": 1, "temperature": 0, "logprobs": True,
                "top_logprobs": self.top_logprobs, "messages": [{"role": "user", "content": content}]}  # fmt: skip
        failure = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                answer = self._request(self.endpoint, body, self.timeout)
            except (OSError, ValueError) as error:
                failure = str(error)
                continue
            failure, score = self._read(answer)
            if score is not None:
                return score
        raise RuntimeError(f"vlm judge {self.endpoint}: {failure} (after {self.retries + 1} attempts)")

    def _read(self, answer: Any) -> tuple[str, float | None]:
        """(why there is no score, the score) of one answer."""
        try:
            alternatives = answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        except (KeyError, IndexError, TypeError):
            quoted = json.dumps(answer, separators=(",", ":"))
            quoted = quoted if len(quoted) <= 80 else quoted[:80] + "..."
            why = "the answer has no choices[0].logprobs.content[0].top_logprobs (does the server return logprobs?)"
            return f"{why}: {quoted}", None
        score = judge_score(alternatives)
        if score is None:
            listed = ", ".join(f"{json.dumps(t['token'])} {float(t['logprob']):.6f}" for t in alternatives)
            return f"neither yes nor no among the first token's {len(alternatives)} top_logprobs: {listed}", None
        return "", score

    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> list[float]:
        finite = torch.isfinite(images.detach()).flatten(1).all(1).tolist() if images.dim() > 1 else []
        if images.dim() == 5:
            images = images[:, images.shape[1] // 2]
        if images.dim() != 4 or images.shape[1] != 3 or len(prompts) != images.shape[0]:
            raise ValueError(
                f"vlm judge: images of shape {tuple(images.shape)} and {len(prompts)} prompts: needs [N, 3, H, W] "
                "(or [N, F, 3, H, W]) and N prompts"
            )
        return [
            self._judge(image, prompt) if ok else math.nan
            for image, prompt, ok in zip(images, prompts, finite, strict=True)
        ]
