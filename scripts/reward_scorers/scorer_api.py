"""What a scorer plug-in of scripts/reward_server.py is given and may raise, plus helpers the plug-ins share.

A plug-in is one module of this package (docs/rewards.md, "The reward server") with

  NAME        str, the name clients ask for ("scorer" of a request) and the module's file name
  VERSION     str, reported by GET /info (change it when the scores change)
  MEDIA       ["image"], ["video"] or ["image", "video"]
  GROUPWISE   bool: True when a score may depend on the other items of its group; the server then calls score()
              once per group with all of that group's items
  COMPONENTS  [str, ...], the names of the per-item sub-scores score() may return
  Scorer      a class: Scorer(options) with options the dict of --scorer NAME:key=value,... (values are
              strings); it raises ScorerStartupError (one line) when an option, a file or a package is missing,
              and it loads everything it needs here, once
  Scorer.score(items) -> (scores, components): one float per item in the order given, and a dict
              {component name: [one float per item]} (may be empty); it raises BadItems (answered 400) for
              input it cannot score, anything else is answered 500

The core (server, this module, the test scorers) needs numpy and Pillow only. A scorer that needs torch or a
model package imports it inside Scorer.__init__ (import_or_fail), so that the server starts without it.
"""
import dataclasses
import importlib
import math
import os

import numpy as np


class ScorerStartupError(Exception):
    """A scorer cannot start: a missing option, file or package. The message is one line naming it."""


class BadItems(ValueError):
    """The items cannot be scored as sent (a client error): the server answers 400 with this one-line message."""


@dataclasses.dataclass
class Item:
    """One decoded item of a /score request.

    pixels: float64 RGB, [3, H, W] (image) or [F, 3, H, W] (video). With encoding float32 these are exactly the
    client's float32 values (finite; usually in [-1, 1], but a decoder's output may overshoot a little, so
    clamp as the scorer's recipe does); with encoding png, byte / 255 * 2 - 1.
    """
    prompt: str
    prompt_index: int
    group: int
    leaf: int
    pixels: np.ndarray
    index: int  # position in the request, for error messages


# ---- Options --------------------------------------------------------------------------------------------------

def take_options(scorer, options, allowed):
    """allowed's defaults (a dict key -> default string, None when the option has no default) updated with
    `options`; ScorerStartupError naming a key that is not in `allowed`."""
    for key in options:
        if key not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise ScorerStartupError("%s has no option '%s' (its options: %s)" % (scorer, key, known))
    merged = dict(allowed)
    merged.update(options)
    return merged


def float_option(scorer, options, key):
    text = options[key]
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ScorerStartupError("%s option %s=%s is not a number" % (scorer, key, text)) from None
    if not math.isfinite(value):
        raise ScorerStartupError("%s option %s=%s is not finite" % (scorer, key, text))
    return value


def int_option(scorer, options, key, minimum=1):
    text = options[key]
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise ScorerStartupError("%s option %s=%s is not an integer" % (scorer, key, text)) from None
    if value < minimum:
        raise ScorerStartupError("%s option %s=%s must be at least %d" % (scorer, key, text, minimum))
    return value


def required_path(scorer, options, key, what):
    """The existing file or folder of option `key`; ScorerStartupError naming the option or the path."""
    path = options.get(key)
    if not path:
        raise ScorerStartupError("%s needs option %s=PATH (%s)" % (scorer, key, what))
    path = os.path.expanduser(path)
    if not os.path.exists(path):
        raise ScorerStartupError("%s option %s=%s: no such file or folder (%s)" % (scorer, key, path, what))
    return path


# ---- Heavy packages, offline -----------------------------------------------------------------------------------

# The versions docs/rewards.md pins for the real scorers (their venv), quoted in the missing-package message.
PIP_LINE = ("pip install 'torch==2.4.1' 'torchvision==0.19.1' 'transformers==4.46.3' 'open-clip-torch==2.24.0' "
            "'image-reward==1.5' 'timm==0.6.13' 'fairscale==0.4.13' numpy pillow")


def go_offline(hf_home=None):
    """Makes huggingface_hub and transformers read local files only. Must run before they are imported, because
    huggingface_hub reads HF_HUB_OFFLINE once at import; hf_home (option hf_home=) names the cache to read."""
    if hf_home:
        os.environ["HF_HOME"] = os.path.expanduser(hf_home)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def import_or_fail(scorer, module):
    """Imports `module` (a heavy package) for `scorer`; ScorerStartupError naming it and the pip line when absent."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ScorerStartupError("%s needs the Python package '%s' (%s); in a venv: %s" %
                                 (scorer, module, str(e).splitlines()[0] if str(e) else "not installed",
                                  PIP_LINE)) from None


def torch_device(scorer, torch, requested):
    """The torch device of option device= (default: cuda when available, else cpu)."""
    name = requested or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ScorerStartupError("%s option device=%s is not a torch device" % (scorer, name)) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ScorerStartupError("%s option device=%s: torch sees no CUDA device" % (scorer, name))
    return device


def start_torch(scorer, modules, requested_device, hf_home=None):
    """What every torch-based scorer does first, in this order: offline mode (go_offline), torch and then its other
    heavy packages imported (import_or_fail: one line naming a missing one), and the device of option device=.
    Returns (torch, [the other modules, in order], device)."""
    go_offline(hf_home)
    torch = import_or_fail(scorer, "torch")
    imported = [import_or_fail(scorer, module) for module in modules]
    return torch, imported, torch_device(scorer, torch, requested_device)


def transformers_clip(transformers, model_path, processor_class, processor_path, device):
    """A transformers CLIPModel from `model_path` (evaluation, on `device`) and its processor, `processor_class`
    of transformers, from `processor_path`; local files only."""
    processor = getattr(transformers, processor_class).from_pretrained(processor_path, local_files_only=True)
    model = transformers.CLIPModel.from_pretrained(model_path, local_files_only=True).eval().to(device)
    return processor, model


def unit_features(torch, features):
    """Features as float32 rows of unit L2 norm (what CLIP-style scores take cosines of)."""
    return torch.nn.functional.normalize(features.float(), dim=-1)


# ---- Pixels ---------------------------------------------------------------------------------------------------

def to_rgb8(pixels):
    """[3, H, W] in [-1, 1] -> uint8 [H, W, 3], byte = round(255 clamp((x + 1) / 2, 0, 1)) with halves rounded
    up, as branchgrpo's image_to_rgb8 (std::lround) does, so a scorer sees the bytes an 8-bit pipeline would."""
    v = np.clip((pixels + 1.0) / 2.0, 0.0, 1.0)
    return np.floor(255.0 * v + 0.5).astype(np.uint8).transpose(1, 2, 0).copy()


def to_pil(pixels):
    """[3, H, W] in [-1, 1] -> an 8-bit RGB PIL image (what the original scorers were trained to read)."""
    from PIL import Image
    return Image.fromarray(to_rgb8(pixels), "RGB")


def require_images(items):
    """Checks that every item is an image [3, H, W]; BadItems naming the first that is not (the server prefixes
    the scorer's name)."""
    for item in items:
        if item.pixels.ndim != 3:
            raise BadItems("scores images [3, H, W] only; item %d has shape %s" % (item.index, list(item.pixels.shape)))


def in_batches(values, size):
    for start in range(0, len(values), size):
        yield values[start:start + size]
