"""hpsv2: Human Preference Score v2.1 (HPSv2, checkpoint HPS_v2.1_compressed.pt). Not tested here (no weights).

Follows the hpsv2 package's scoring recipe: an open_clip ViT-H-14 (the laion2B-s32B-b79K architecture) whose
whole state dict is the checkpoint's "state_dict"; the image through open_clip's validation transform (resize
the shorter side to 224, bicubic; centre crop 224; OpenAI CLIP mean / std) from the 8-bit RGB image; the prompt
through the ViT-H-14 tokenizer (77 tokens); score = cosine similarity of the L2-normalised image and text
features (no logit scale), about 0.2 to 0.35. The model is built with open_clip_torch rather than the hpsv2
package's bundled copy of it, because hpsv2 1.2.0's wheel lacks that copy's BPE vocabulary file; the
architecture and the state dict keys are open_clip's. pretrained=None: nothing is downloaded.

Options: checkpoint=PATH (HPS_v2.1_compressed.pt, required), device= (default cuda when available), batch=16.
"""
from .scorer_api import (in_batches, int_option, require_images, required_path, start_torch, take_options, to_pil,
                         unit_features)

NAME = "hpsv2"
VERSION = "2.1"
MEDIA = ["image"]
GROUPWISE = False
COMPONENTS = []


class Scorer:
    def __init__(self, options):
        options = take_options(NAME, options, {"checkpoint": None, "device": None, "batch": "16"})
        checkpoint = required_path(NAME, options, "checkpoint", "the HPS_v2.1_compressed.pt file")
        self.batch = int_option(NAME, options, "batch")
        self.torch, (open_clip,), self.device = start_torch(NAME, ["open_clip"], options["device"])
        torch = self.torch
        model, _, self.preprocess = open_clip.create_model_and_transforms("ViT-H-14", pretrained=None,
                                                                           precision="fp32", device="cpu")
        state = torch.load(checkpoint, map_location="cpu")
        model.load_state_dict(state["state_dict"] if "state_dict" in state else state)
        self.model = model.to(self.device).eval()
        self.tokenizer = open_clip.get_tokenizer("ViT-H-14")

    def score(self, items):
        require_images(items)
        torch = self.torch
        scores = []
        with torch.no_grad():
            for chunk in in_batches(items, self.batch):
                images = torch.stack([self.preprocess(to_pil(item.pixels)) for item in chunk]).to(self.device)
                text = self.tokenizer([item.prompt for item in chunk]).to(self.device)
                image_features = unit_features(torch, self.model.encode_image(images))
                text_features = unit_features(torch, self.model.encode_text(text))
                scores.extend((image_features * text_features).sum(-1).tolist())
        return scores, {}
