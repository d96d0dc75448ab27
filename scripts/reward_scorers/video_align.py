"""video_align: the plug-in point for VideoAlign's VideoReward (a Qwen2-VL reward model scoring a video's visual
quality VQ, motion quality MQ and text alignment TA). Not implemented here: VideoAlign is not on PyPI, and its
inference code is a script of its repository, not a package.

To hook it up:
  1. git clone https://github.com/KwaiVGI/VideoAlign; install its environment (environment.yaml) in the venv the
     server runs in; put its checkpoint (Hugging Face KwaiVGI/VideoReward) in a local folder.
  2. In Scorer.__init__ below: put the clone on sys.path, go_offline(), and build its
     inference.VideoVLMRewardInference(checkpoint_folder, device=..., dtype=torch.bfloat16) once.
  3. In Scorer.score: write each item's frames (item.pixels [F, 3, H, W] in [-1, 1]; scorer_api.to_rgb8 per
     frame) to a temporary .mp4 at the clip's frame rate, call reward(video_paths, prompts, use_norm=True),
     which answers one {"VQ", "MQ", "TA", "Overall"} per video: return Overall (= VQ + MQ + TA) as the scores
     and VQ, MQ, TA as the components.
  4. Remove the raise below and give the module a VERSION naming the checkpoint.
"""
from .scorer_api import ScorerStartupError

NAME = "video_align"
VERSION = "unimplemented"
MEDIA = ["video"]
GROUPWISE = False
COMPONENTS = ["VQ", "MQ", "TA"]


class Scorer:
    def __init__(self, options):
        raise ScorerStartupError(
            "video_align is a plug-in point, not a scorer yet: VideoAlign is not on PyPI; clone "
            "https://github.com/KwaiVGI/VideoAlign, install its environment, get the KwaiVGI/VideoReward checkpoint, "
            "and hook its VideoVLMRewardInference into scripts/reward_scorers/video_align.py (steps in that file; "
            "docs/rewards.md, 'The reward server')")

    def score(self, items):
        raise NotImplementedError("video_align: see the module docstring")
