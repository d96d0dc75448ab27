"""imagereward: ImageReward v1.0 (the image-reward package, THUDM/ImageReward). Not tested here (no weights).

Follows the package's own scoring (ImageReward.score): BLIP's image transform (resize 224 bicubic, centre crop
224, OpenAI CLIP mean / std) on the 8-bit RGB image, BLIP's BERT tokenizer padded to 35 tokens, the text encoder
cross-attending to the image, the MLP head on the [CLS] feature, standardised with the package's constants
((r - 0.16717362830052426) / 1.0333394966054072): scores about -2 to 2. Items sharing a prompt are scored
together.

Options: model=PATH (ImageReward.pt, required), med_config=PATH (its med_config.json, required; given so the
package downloads nothing), hf_home=PATH (the Hugging Face cache holding bert-base-uncased's tokenizer, which
BLIP loads by name; default the usual cache), device=. Offline: HF_HUB_OFFLINE=1.
"""
import numpy as np

from .scorer_api import require_images, required_path, start_torch, take_options, to_pil

NAME = "imagereward"
VERSION = "1.0"
MEDIA = ["image"]
GROUPWISE = False
COMPONENTS = []


class Scorer:
    def __init__(self, options):
        options = take_options(NAME, options, {"model": None, "med_config": None, "hf_home": None, "device": None})
        model_path = required_path(NAME, options, "model", "the ImageReward.pt file")
        med_config = required_path(NAME, options, "med_config", "ImageReward's med_config.json")
        if options["hf_home"]:
            required_path(NAME, options, "hf_home", "a Hugging Face cache holding bert-base-uncased")
        self.torch, (image_reward,), device = start_torch(NAME, ["ImageReward"], options["device"], options["hf_home"])
        # A file path as the name: RM.load reads it instead of downloading "ImageReward-v1.0".
        self.model = image_reward.load(model_path, device=str(device), med_config=med_config).eval()

    def score(self, items):
        require_images(items)
        by_prompt = {}
        for position, item in enumerate(items):
            by_prompt.setdefault(item.prompt, []).append(position)
        scores = [0.0] * len(items)
        with self.torch.no_grad():
            for prompt, positions in by_prompt.items():
                # score(prompt, [images]) answers a list, or a bare float for a one-image list.
                rewards = np.atleast_1d(self.model.score(prompt, [to_pil(items[p].pixels) for p in positions]))
                for position, reward in zip(positions, rewards.tolist()):
                    scores[position] = float(reward)
        return scores, {}
