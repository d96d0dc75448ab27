"""pickscore: PickScore v1 (yuvalkirstain/PickScore_v1, a transformers CLIPModel: CLIP-H fine-tuned on
Pick-a-Pic). Not tested here (no weights).

Follows PickScore's own scoring recipe: its processor is that of laion/CLIP-ViT-H-14-laion2B-s32B-b79K (image:
shorter side to 224 bicubic, centre crop 224, OpenAI CLIP mean / std, from the 8-bit RGB image; text padded and
truncated to 77 tokens); image and text embeddings from get_image_features / get_text_features, each
L2-normalised; score = logit_scale.exp() * cosine similarity, about 18 to 24 (logit_scale.exp() is about 100).

Options: model=PATH (a local copy of PickScore_v1, required), processor=PATH (a local copy of
CLIP-ViT-H-14-laion2B-s32B-b79K's processor files, required), device=, batch=16. Offline: local files only.
"""
from .scorer_api import (go_offline, import_or_fail, in_batches, int_option, require_images, required_path,
                         take_options, to_pil, torch_device)

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
        go_offline()
        self.torch = torch = import_or_fail(NAME, "torch")
        transformers = import_or_fail(NAME, "transformers")
        self.device = torch_device(NAME, torch, options["device"])
        self.processor = transformers.AutoProcessor.from_pretrained(processor_path, local_files_only=True)
        self.model = transformers.CLIPModel.from_pretrained(model_path, local_files_only=True).eval().to(self.device)

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
                image = torch.nn.functional.normalize(image.float(), dim=-1)
                text = torch.nn.functional.normalize(text.float(), dim=-1)
                scale = self.model.logit_scale.exp().float()
                scores.extend((scale * (image * text).sum(-1)).tolist())
        return scores, {}
