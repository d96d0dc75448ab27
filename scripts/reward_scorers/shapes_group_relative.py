"""shapes_group_relative: a groupwise test scorer. Each item's shapes_alignment score minus the mean of its group's,
so a score depends on the other leaves of its tree: the server must hand it every item of a group at once (and
only that group's). It exists to test the groupwise path of the protocol; it is not a useful training reward
(GRPO's advantage already centres scores within a group).

Options: those of shapes_alignment. Components: alignment (the item's own shapes_alignment score) and group_mean.
"""
from . import shapes_alignment

NAME = "shapes_group_relative"
VERSION = "1"
MEDIA = ["image"]
GROUPWISE = True
COMPONENTS = ["alignment", "group_mean"]


class Scorer:
    def __init__(self, options):
        self.alignment = shapes_alignment.Scorer(options)

    def score(self, items):
        own, _ = self.alignment.score(items)
        mean = sum(own) / len(own)
        return [value - mean for value in own], {"alignment": own, "group_mean": [mean] * len(own)}
