"""pickscore: PickScore v1 (yuvalkirstain/PickScore_v1, a transformers CLIPModel: CLIP-H fine-tuned on
Pick-a-Pic). Not tested here (no weights).

Follows PickScore's own scoring recipe: its processor is that of laion/CLIP-ViT-H-14-laion2B-s32B-b79K (image:
shorter side to 224 bicubic, centre crop 224, OpenAI CLIP mean / std, from the 8-bit RGB image; text padded and
truncated to 77 tokens); image and text embeddings from get_image_features / get_text_features, each
L2-normalised; score = logit_scale.exp() * cosine similarity, about 18 to 24 (logit_scale.exp() is about 100).

Options: model=PATH (a local copy of PickScore_v1, required), processor=PATH (a local copy of
CLIP-ViT-H-14-laion2B-s32B-b79K's processor files, required), device=, batch=16. Offline: local files only.
"""
from .scorer_api import (in_batches, int_option, require_images, required_path, start_torch, take_options, to_pil,
                         transformers_clip, unit_features)

NAME = "pickscore"
VERSION = "1"
MEDIA = ["image"]
GROUPWISE = False
COMPONENTS = []


class Scorer:
    def __init__(self, options):
        options = take_options(NAME, options, {"model": None, "processor": None, "device": None, "batch": "16"})
        model_path = required_path(NAME, options, "model", "a folder holding PickScore_v1")
        processor_path = required_path(NAME, options, "processor",
                                       "a folder holding CLIP-ViT-H-14-laion2B-s32B-b79K's processor")
        self.batch = int_option(NAME, options, "batch")
        self.torch, (transformers,), self.device = start_torch(NAME, ["transformers"], options["device"])
        self.processor, self.model = transformers_clip(transformers, model_path, "AutoProcessor", processor_path,
                                                       self.device)

    def score(self, items):
        require_images(items)
        torch = self.torch
        scores = []
        with torch.no_grad():
            for chunk in in_batches(items, self.batch):
                image_inputs = self.processor(images=[to_pil(item.pixels) for item in chunk], return_tensors="pt")
                text_inputs = self.processor(text=[item.prompt for item in chunk], padding=True, truncation=True,
                                             max_length=77, return_tensors="pt")
                image = self.model.get_image_features(pixel_values=image_inputs["pixel_values"].to(self.device))
                text = self.model.get_text_features(input_ids=text_inputs["input_ids"].to(self.device),
                                                    attention_mask=text_inputs["attention_mask"].to(self.device))
                image, text = unit_features(torch, image), unit_features(torch, text)
                scale = self.model.logit_scale.exp().float()
                scores.extend((scale * (image * text).sum(-1)).tolist())
        return scores, {}
