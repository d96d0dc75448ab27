"""aesthetic: the LAION aesthetic predictor (improved-aesthetic-predictor, sac+logos+ava1-l14-linearMSE.pth) on
CLIP ViT-L/14 image embeddings. Not tested here (no weights).

Follows the predictor's recipe (and DDPO's aesthetic reward, which uses it): the image embedding of OpenAI's
CLIP ViT-L/14 (transformers openai/clip-vit-large-patch14, get_image_features, 768 values, from its processor:
shorter side to 224 bicubic, centre crop 224, OpenAI CLIP mean / std, from the 8-bit RGB image), L2-normalised,
then the predictor's MLP: Linear 768-1024, Dropout 0.2, Linear 1024-128, Dropout 0.2, Linear 128-64, Dropout 0.1,
Linear 64-16, Linear 16-1, no activations (state dict keys layers.0 ... layers.7). Score about 1 to 10. The
prompt is not used.

Options: clip=PATH (a local copy of openai/clip-vit-large-patch14, required), predictor=PATH (the .pth file,
required), device=, batch=32. Offline: local files only.
"""
from .scorer_api import (in_batches, int_option, require_images, required_path, start_torch, take_options, to_pil,
                         transformers_clip, unit_features)

NAME = "aesthetic"
VERSION = "laion-v2-l14"
MEDIA = ["image"]
GROUPWISE = False
COMPONENTS = []


class Scorer:
    def __init__(self, options):
        options = take_options(NAME, options, {"clip": None, "predictor": None, "device": None, "batch": "32"})
        clip_path = required_path(NAME, options, "clip", "a folder holding openai/clip-vit-large-patch14")
        predictor_path = required_path(NAME, options, "predictor", "sac+logos+ava1-l14-linearMSE.pth")
        self.batch = int_option(NAME, options, "batch")
        self.torch, (transformers,), self.device = start_torch(NAME, ["transformers"], options["device"])
        torch = self.torch
        self.processor, self.clip = transformers_clip(transformers, clip_path, "CLIPProcessor", clip_path, self.device)
        nn = torch.nn

        class AestheticHead(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.Sequential(nn.Linear(768, 1024), nn.Dropout(0.2), nn.Linear(1024, 128),
                                            nn.Dropout(0.2), nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16),
                                            nn.Linear(16, 1))

            def forward(self, embedding):
                return self.layers(embedding)

        self.head = AestheticHead()
        self.head.load_state_dict(torch.load(predictor_path, map_location="cpu"))
        self.head = self.head.eval().to(self.device)

    def score(self, items):
        require_images(items)
        torch = self.torch
        scores = []
        with torch.no_grad():
            for chunk in in_batches(items, self.batch):
                inputs = self.processor(images=[to_pil(item.pixels) for item in chunk], return_tensors="pt")
                embedding = self.clip.get_image_features(pixel_values=inputs["pixel_values"].to(self.device))
                embedding = unit_features(torch, embedding)
                scores.extend(self.head(embedding).squeeze(-1).tolist())
        return scores, {}
