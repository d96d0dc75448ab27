"""shapes_alignment: branchgrpo's shape_alignment reward (tools/app/branchgrpo/app/rewards.hpp, docs/rewards.md
"Shape alignment") in numpy, the reward server's test scorer.

Computed in float64 on the decoded pixels, step for step as measure_shape and shape_alignment::score do, so that
with encoding float32 it equals the C++ reward to rounding (within 1e-12): the same clamp, the same medians, the
sums in the C++ loops' order (np.add.accumulate is a sequential sum, unlike np.sum's pairwise one), math.exp
(the C library's exp, as std::exp). The prompt's colour and shape come from the prompt string (as
parse_shapes_prompt reads it), not from prompt_index.

Options: colour_weight (0.5), colour_width (0.2), fill_width (0.08), fill_targets (circle/square/triangle,
default pi/4/1/0.58, written with "/" since "," separates options).
Components: colour (s_colour) and shape (s_shape); both 0 for an image without an object.
"""
import math

import numpy as np

from .scorer_api import BadItems, ScorerStartupError, float_option, require_images, take_options

NAME = "shapes_alignment"
VERSION = "1"
MEDIA = ["image"]
GROUPWISE = False
COMPONENTS = ["colour", "shape"]

# shapes.hpp: shapes_colour_names, shapes_shape_names, shapes_palette.
COLOUR_NAMES = ("red", "green", "blue", "yellow")
SHAPE_NAMES = ("circle", "square", "triangle")
PALETTE = ((0.90, 0.10, 0.10), (0.10, 0.75, 0.15), (0.15, 0.25, 0.95), (0.95, 0.85, 0.10))
DEFAULT_FILL_TARGETS = (math.pi / 4, 1.0, 0.58)

# std::isspace in the C locale; str.split() would also split at Unicode spaces, which the C++ does not.
_ASCII_SPACE = " \t\n\v\f\r"


def _ascii_lower(word):
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in word)


def parse_shapes_prompt(prompt):
    """(colour index, shape index) of the prompt's first colour word and first shape word (ASCII
    case-insensitive, words split at ASCII whitespace), as parse_shapes_prompt in shapes.hpp."""
    colour = shape = None
    word = []
    for c in prompt + " ":
        if c not in _ASCII_SPACE:
            word.append(c)
            continue
        if word:
            lower = _ascii_lower("".join(word))
            if colour is None and lower in COLOUR_NAMES:
                colour = COLOUR_NAMES.index(lower)
            if shape is None and lower in SHAPE_NAMES:
                shape = SHAPE_NAMES.index(lower)
            word = []
    if colour is None:
        raise BadItems("prompt '%s' names no colour (red, green, blue, yellow)" % prompt)
    if shape is None:
        raise BadItems("prompt '%s' names no shape (circle, square, triangle)" % prompt)
    return colour, shape


def _median(values):
    """The C++ median: the middle of the sorted values, or the mean of the two middle ones."""
    s = np.sort(values)
    m = s.size
    return float(s[m // 2]) if m % 2 else (float(s[m // 2 - 1]) + float(s[m // 2])) / 2


def _sequential_sum(values):
    """sum of values in order, as a C++ `total += value` loop (np.sum adds pairwise and may differ in the last bit)."""
    flat = np.ravel(values)
    return float(np.add.accumulate(flat)[-1]) if flat.size else 0.0


def measure_shape(image):
    """measure_shape of rewards.hpp on one image [3, H, W] (float64, finite): (object, foreground, background,
    area, fill)."""
    v = np.clip((image + 1.0) / 2.0, 0.0, 1.0)
    background = []
    for k in range(3):
        channel = v[k]
        border = np.concatenate([channel[0, :], channel[-1, :], channel[1:-1, 0], channel[1:-1, -1]])
        background.append(_median(border))
    b = background
    d0, d1, d2 = v[0] - b[0], v[1] - b[1], v[2] - b[2]
    distance = np.sqrt(d0 * d0 + d1 * d1 + d2 * d2)  # the C++ adds the channels in this order
    farthest = float(distance.max())
    if farthest < 0.25:
        return False, [0.0, 0.0, 0.0], background, 0.0, 0.0
    far = distance >= 0.5 * farthest
    f = [_median(v[k][far]) for k in range(3)]
    axis = [f[k] - b[k] for k in range(3)]
    axis_squared = axis[0] * axis[0] + axis[1] * axis[1] + axis[2] * axis[2]
    projection = d0 * axis[0] + d1 * axis[1] + d2 * axis[2]
    m = np.clip((projection / axis_squared - 0.15) / 0.7, 0.0, 1.0)
    area = _sequential_sum(m)  # row-major, as the C++ loop over i then j
    width = _sequential_sum(m.max(axis=0))
    height = _sequential_sum(m.max(axis=1))
    fill = area / (width * height) if width * height > 0 else 0.0
    return True, f, background, area, fill


class Scorer:
    def __init__(self, options):
        options = take_options(NAME, options, {"colour_weight": "0.5", "colour_width": "0.2",
                                               "fill_width": "0.08", "fill_targets": None})
        self.colour_weight = float_option(NAME, options, "colour_weight")
        self.colour_width = float_option(NAME, options, "colour_width")
        self.fill_width = float_option(NAME, options, "fill_width")
        if not 0 <= self.colour_weight <= 1:
            raise ScorerStartupError("%s colour_weight must be in [0, 1], got %s" % (NAME, options["colour_weight"]))
        for key in ("colour_width", "fill_width"):
            if not getattr(self, key) > 0:
                raise ScorerStartupError("%s %s must be positive, got %s" % (NAME, key, options[key]))
        self.fill_targets = DEFAULT_FILL_TARGETS
        if options["fill_targets"] is not None:
            parts = options["fill_targets"].split("/")
            if len(parts) != 3:
                raise ScorerStartupError("%s fill_targets=%s: expected circle/square/triangle, three numbers" %
                                         (NAME, options["fill_targets"]))
            self.fill_targets = tuple(float_option(NAME, {"fill_targets": p}, "fill_targets") for p in parts)

    def score_one(self, image, prompt):
        """(r, s_colour, s_shape) of one image for a prompt, as shape_alignment::score."""
        colour_index, shape_index = parse_shapes_prompt(prompt)
        found, f, _, _, fill = measure_shape(image)
        if not found:
            return 0.0, 0.0, 0.0
        target = PALETTE[colour_index]
        squared = 0.0
        for k in range(3):
            squared += (f[k] - target[k]) * (f[k] - target[k])
        colour = math.exp(-squared / (2 * self.colour_width * self.colour_width))
        gap = fill - self.fill_targets[shape_index]
        shape = math.exp(-gap * gap / (2 * self.fill_width * self.fill_width))
        return self.colour_weight * colour + (1 - self.colour_weight) * shape, colour, shape

    def score(self, items):
        require_images(items)
        for item in items:
            if item.pixels.shape[1] < 3 or item.pixels.shape[2] < 3:
                raise BadItems("needs images of at least 3 x 3 pixels; item %d is %d x %d (H x W)" %
                               (item.index, item.pixels.shape[1], item.pixels.shape[2]))
        rows = []
        for item in items:
            try:
                rows.append(self.score_one(item.pixels, item.prompt))
            except BadItems as e:
                raise BadItems("item %d: %s" % (item.index, e)) from None
        return [r[0] for r in rows], {"colour": [r[1] for r in rows], "shape": [r[2] for r in rows]}
