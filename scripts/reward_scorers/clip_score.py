"""clip_score: CLIP score of image and prompt with a transformers CLIPModel. Not tested here (no weights).

Follows torchmetrics' CLIPScore (its default model is openai/clip-vit-large-patch14): the model's own processor
(shorter side to 224 bicubic, centre crop 224, OpenAI CLIP mean / std, from the 8-bit RGB image; text truncated
to 77 tokens), image and text embeddings from get_image_features / get_text_features, each L2-normalised;
score = scale * max(cosine, 0) with scale 100. Hessel et al.'s CLIP-S (ViT-B/32) is the same with scale=2.5.

Options: model=PATH (a local CLIP folder, e.g. a copy of openai/clip-vit-large-patch14, required), scale=100,
device=, batch=32. Offline: local files only.
"""
from .scorer_api import (float_option, in_batches, int_option, require_images, required_path, start_torch,
                         take_options, to_pil, transformers_clip, unit_features)

NAME = "clip_score"
VERSION = "1"
MEDIA = ["image"]
GROUPWISE = False
COMPONENTS = []


class Scorer:
    def __init__(self, options):
        options = take_options(NAME, options, {"model": None, "scale": "100", "device": None, "batch": "32"})
        model_path = required_path(NAME, options, "model", "a folder holding a CLIP model and its processor")
        self.scale = float_option(NAME, options, "scale")
        self.batch = int_option(NAME, options, "batch")
        self.torch, (transformers,), self.device = start_torch(NAME, ["transformers"], options["device"])
        self.processor, self.model = transformers_clip(transformers, model_path, "CLIPProcessor", model_path,
                                                       self.device)

    def score(self, items):
        require_images(items)
        torch = self.torch
        scores = []
        with torch.no_grad():
            for chunk in in_batches(items, self.batch):
                inputs = self.processor(text=[item.prompt for item in chunk],
                                        images=[to_pil(item.pixels) for item in chunk],
                                        padding=True, truncation=True, max_length=77, return_tensors="pt")
                image = self.model.get_image_features(pixel_values=inputs["pixel_values"].to(self.device))
                text = self.model.get_text_features(input_ids=inputs["input_ids"].to(self.device),
                                                    attention_mask=inputs["attention_mask"].to(self.device))
                cosine = (unit_features(torch, image) * unit_features(torch, text)).sum(-1)
                scores.extend((self.scale * cosine.clamp(min=0)).tolist())
        return scores, {}
