"""The scorer plug-ins of scripts/reward_server.py: one module per scorer, listed in SCORERS.

Adding a scorer: write reward_scorers/<name>.py with NAME, VERSION, MEDIA, GROUPWISE, COMPONENTS and a Scorer
class (scorer_api.py says what each must be), then add "<name>" to SCORERS. Importing a plug-in must stay cheap
and need numpy and Pillow only: heavy packages are imported in Scorer.__init__.
"""
import importlib

from .scorer_api import ScorerStartupError

SCORERS = [
    "shapes_alignment",       # test scorer: branchgrpo's shape_alignment reward, numpy only
    "shapes_group_relative",  # test scorer: groupwise (alignment minus its group's mean)
    "pixel_mean",             # test scorer: the mean pixel, for checking every media and encoding
    "hpsv2",
    "pickscore",
    "imagereward",
    "clip_score",
    "aesthetic",
    "video_align",            # a plug-in point: VideoAlign is not on PyPI
]

_MEDIA = ("image", "video")


def load_module(name):
    """The plug-in module of scorer `name`, its declarations checked; ScorerStartupError for an unknown name."""
    if name not in SCORERS:
        raise ScorerStartupError("unknown scorer '%s' (known: %s)" % (name, ", ".join(SCORERS)))
    try:
        module = importlib.import_module("." + name, __name__)
    except Exception as e:  # a broken plug-in: one line, not a traceback
        raise ScorerStartupError("cannot import reward_scorers/%s.py: %s: %s" %
                                 (name, type(e).__name__, " ".join(str(e).split()))) from None
    declared = (getattr(module, "NAME", None) == name and isinstance(getattr(module, "VERSION", None), str)
                and isinstance(getattr(module, "MEDIA", None), list) and module.MEDIA
                and all(m in _MEDIA for m in module.MEDIA) and isinstance(getattr(module, "GROUPWISE", None), bool)
                and isinstance(getattr(module, "COMPONENTS", None), list)
                and all(isinstance(c, str) for c in module.COMPONENTS) and hasattr(module, "Scorer"))
    if not declared:
        raise ScorerStartupError("scorer module reward_scorers/%s.py lacks a valid NAME, VERSION, MEDIA, GROUPWISE, "
                                 "COMPONENTS or Scorer (see reward_scorers/scorer_api.py)" % name)
    return module


def parse_spec(spec):
    """'NAME[:key=value,...]' -> (name, {key: value}); ScorerStartupError naming a malformed part."""
    name, _, rest = spec.partition(":")
    options = {}
    if rest:
        for part in rest.split(","):
            key, equals, value = part.partition("=")
            if not equals or not key:
                raise ScorerStartupError("--scorer %s: option '%s' is not key=value" % (spec, part))
            if key in options:
                raise ScorerStartupError("--scorer %s: option '%s' given twice" % (spec, key))
            options[key] = value
    return name, options
