"""pixel_mean: a test scorer for the decoding of every media and encoding. An item's score is the mean of its
decoded pixels (all channels, and all frames of a video), so a test knows the exact answer for float32 and for
PNG (byte / 255 * 2 - 1). Components: frames (1 for an image), height, width. No options.
"""
import math

from .scorer_api import take_options

NAME = "pixel_mean"
VERSION = "1"
MEDIA = ["image", "video"]
GROUPWISE = False
COMPONENTS = ["frames", "height", "width"]


class Scorer:
    def __init__(self, options):
        take_options(NAME, options, {})

    def score(self, items):
        scores = [math.fsum(item.pixels.ravel().tolist()) / item.pixels.size for item in items]
        frames = [float(item.pixels.shape[0]) if item.pixels.ndim == 4 else 1.0 for item in items]
        return scores, {"frames": frames,
                        "height": [float(item.pixels.shape[-2]) for item in items],
                        "width": [float(item.pixels.shape[-1]) for item in items]}
