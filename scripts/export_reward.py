#!/usr/bin/env python3
"""Export HPS-v2.1, PickScore, ImageReward or a CLIP score as a branchgrpo TorchScript reward module.

The module (docs/export_rewards.md) is what a run's [[rewards]] entry name = "torchscript" loads:

  forward(images [B, 3, H, W] float32 in [0, 1], prompts int64 [B]) -> scores [B]

`prompts` index the run's prompt list, so every prompt is encoded here, once, from --prompts: the run's
prompt-embeddings file (or shard directory) that scripts/export_prompt_embeddings.py wrote, whose "prompts"
metadata is that list. The module keeps the list as its attribute `training_prompts` (List[str]); the trainer
refuses a module whose list differs from its run's. Images are resized (shorter side, bicubic, antialiased),
centre-cropped and normalized inside the module with the model's own sizes and constants.

  --model hpsv2        HPS v2.1: open_clip ViT-H-14 with HPS_v2.1_compressed.pt's "state_dict" (--weights FILE);
                       score = cos(image, text) of the L2-normalized features, no scale
  --model pickscore    PickScore v1: a transformers CLIPModel (--weights DIR, a copy of PickScore_v1) with the
                       processor of CLIP-ViT-H-14-laion2B-s32B-b79K (--processor DIR); score =
                       logit_scale.exp() * cos(image, text)
  --model clip         CLIP score (torchmetrics' CLIPScore): a transformers CLIPModel and processor (--weights DIR,
                       e.g. a copy of openai/clip-vit-large-patch14); score = --clip-scale * max(cos, 0)
  --model imagereward  ImageReward v1.0 (pip install image-reward): --weights ImageReward.pt, --med-config its
                       med_config.json, --hf-home a Hugging Face cache holding bert-base-uncased's tokenizer;
                       score = (MLP(BERT [CLS] cross-attending to BLIP's ViT-L) - 0.16717362830052426)
                       / 1.0333394966054072

Everything is read from local files (offline); nothing is downloaded.

Usage:
  python3 scripts/export_reward.py --model pickscore --prompts prompts.safetensors --out pickscore.pt \\
      --weights PickScore_v1/ --processor CLIP-ViT-H-14-laion2B-s32B-b79K/ [--device cuda]
"""
import argparse
import glob
import importlib.util
import os
import re
import sys

MODELS = ("hpsv2", "pickscore", "imagereward", "clip")
# The flags each model takes besides --prompts, --out, --weights and --device.
MODEL_FLAGS = {"hpsv2": ("open_clip_config",), "pickscore": ("processor",), "clip": ("processor", "clip_scale"),
               "imagereward": ("med_config", "hf_home")}
# ImageReward's standardization of the head's output (the package's ImageReward.score).
IMAGE_REWARD_MEAN, IMAGE_REWARD_STD = 0.16717362830052426, 1.0333394966054072
# The tokens ImageReward pads and truncates prompts to, and its image size.
IMAGE_REWARD_TOKENS, IMAGE_REWARD_SIZE = 35, 224
# The OpenAI CLIP normalization all four models use (ImageReward's BLIP transform writes it out).
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
SHARD_NAME = re.compile(r"^(.+)-(\d+)-of-(\d+)\.safetensors$")


def fail(message):
    sys.exit("error: " + message)


# ---- The run's prompt list --------------------------------------------------------------------------------------

def prompts_of_file(path):
    """The prompts of one prompt-embeddings file, in row order; one line naming the file when it is not one."""
    from safetensors import safe_open

    try:
        with safe_open(path, "pt") as f:
            metadata = f.metadata() or {}
            rows = f.get_slice("context").get_shape()[0] if "context" in f.keys() else None
    except Exception as e:  # safetensors raises its own error types, and OSError for unreadable files
        fail("%s: not a safetensors file (%s)" % (path, str(e).splitlines()[0] if str(e) else type(e).__name__))
    if "prompts" not in metadata:
        fail("%s: no __metadata__ key 'prompts': not a prompt-embeddings file (scripts/export_prompt_embeddings.py "
             "writes one)" % path)
    prompts = metadata["prompts"].split("\n")
    if rows is not None and rows != len(prompts):
        fail("%s: %d prompt strings for %d embedding rows" % (path, len(prompts), rows))
    return prompts


def training_prompts(path):
    """The run's prompt list from a prompt-embeddings file or a directory of its shards NAME-i-of-K.safetensors
    (read in shard order, as the trainer does)."""
    if os.path.isdir(path):
        shards = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not shards:
            fail("%s: a prompt dataset directory holds no *.safetensors shards" % path)
        for shard in shards:
            if not SHARD_NAME.match(os.path.basename(shard)):
                fail("%s: shard '%s' is not named NAME-00001-of-00004.safetensors" % (path, os.path.basename(shard)))
        return [prompt for shard in shards for prompt in prompts_of_file(shard)]
    if not os.path.exists(path):
        fail("--prompts %s: no such file or directory" % path)
    return prompts_of_file(path)


# ---- Pieces of the module ---------------------------------------------------------------------------------------

def define_modules(torch):
    """The module classes, defined once torch is imported (the script's argument checks need no torch)."""
    import torch.nn.functional as F
    from typing import List

    @torch.jit.script
    def resize_crop_normalize(images: torch.Tensor, resize: int, crop: int, mean: torch.Tensor, std: torch.Tensor,
                              torchvision_crop: bool) -> torch.Tensor:
        """The PIL pipelines' preprocessing on float images: shorter side to `resize`, the longer to
        int(resize * long / short) as both transformers and torchvision truncate it (bicubic, antialiased when
        shrinking); a centre crop of crop x crop whose offset is excess // 2 (transformers) or, with
        `torchvision_crop`, round(excess / 2) with halves to even (torchvision's CenterCrop); (x - mean) / std.
        Scripted, so a traced module keeps the size arithmetic dynamic instead of baking in the example's size."""
        h, w = images.shape[-2], images.shape[-1]
        nh, nw = (resize, int(resize * w / h)) if h <= w else (int(resize * h / w), resize)
        x = F.interpolate(images, size=[nh, nw], mode="bicubic", align_corners=False, antialias=True)
        top, left = (nh - crop) // 2, (nw - crop) // 2
        if torchvision_crop:  # Python's round(k + 0.5) is k + 1 for odd k only
            top += (nh - crop) % 2 * (top % 2)
            left += (nw - crop) % 2 * (left % 2)
        x = x[:, :, top:top + crop, left:left + crop].clamp(0.0, 1.0)  # PIL clips bicubic overshoot to [0, 255]
        return (x - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)

    class Preprocess(torch.nn.Module):
        def __init__(self, resize, crop, mean, std, torchvision_crop):
            super().__init__()
            self.resize, self.crop, self.torchvision_crop = int(resize), int(crop), bool(torchvision_crop)
            self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
            self.register_buffer("std", torch.tensor(std, dtype=torch.float32))

        def forward(self, images):
            return resize_crop_normalize(images, self.resize, self.crop, self.mean, self.std, self.torchvision_crop)

    class TransformersImageFeatures(torch.nn.Module):
        """CLIPModel.get_image_features written out, so the trace does not depend on transformers' return types."""

        def __init__(self, model):
            super().__init__()
            self.vision, self.projection = model.vision_model, model.visual_projection

        def forward(self, pixels):
            return self.projection(self.vision(pixel_values=pixels, return_dict=False)[1])

    class CosineReward(torch.nn.Module):
        """scale * cos(image, text[prompt]) of L2-normalized features, floored at 0 when `floor` (CLIP score)."""

        def __init__(self, preprocess, image_features, text_features, scale, floor):
            super().__init__()
            self.preprocess, self.image_features = preprocess, image_features
            self.register_buffer("text", F.normalize(text_features.float(), dim=-1))
            self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32).reshape(()))
            self.floor = floor

        def forward(self, images, prompts):
            image = F.normalize(self.image_features(self.preprocess(images)).float(), dim=-1)
            cosine = (image * self.text[prompts]).sum(-1)
            return self.scale * (cosine.clamp(min=0.0) if self.floor else cosine)

    class ImageRewardScore(torch.nn.Module):
        """ImageReward: the text encoder sees the image, so token ids and masks (not features) are kept per prompt."""

        def __init__(self, preprocess, model, ids, mask):
            super().__init__()
            self.preprocess = preprocess
            self.visual, self.text_encoder, self.mlp = model.blip.visual_encoder, model.blip.text_encoder, model.mlp
            self.register_buffer("ids", ids)
            self.register_buffer("mask", mask)

        def forward(self, images, prompts):
            image_embeds = self.visual(self.preprocess(images))
            image_mask = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=images.device)
            out = self.text_encoder(self.ids[prompts], attention_mask=self.mask[prompts],
                                    encoder_hidden_states=image_embeds, encoder_attention_mask=image_mask,
                                    return_dict=False)[0]
            reward = self.mlp(out[:, 0, :].float()).squeeze(-1)
            return (reward - IMAGE_REWARD_MEAN) / IMAGE_REWARD_STD

    class PromptListedReward(torch.nn.Module):
        """The saved module: the traced scorer and the prompt list its `prompts` index (checked by the trainer)."""
        training_prompts: List[str]

        def __init__(self, scorer, prompts):
            super().__init__()
            self.scorer = scorer
            self.training_prompts = list(prompts)

        def forward(self, images: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
            return self.scorer(images, prompts)

    return {"Preprocess": Preprocess, "TransformersImageFeatures": TransformersImageFeatures,
            "CosineReward": CosineReward, "ImageRewardScore": ImageRewardScore,
            "PromptListedReward": PromptListedReward}


def in_batches(values, size):
    for start in range(0, len(values), size):
        yield values[start:start + size]


# ---- The models -------------------------------------------------------------------------------------------------

def transformers_clip_reward(torch, modules, args, prompts, scale_of):
    """PickScore or a CLIP score: a transformers CLIPModel (--weights) and its processor (--processor)."""
    import transformers

    processor = transformers.AutoProcessor.from_pretrained(args.processor or args.weights, local_files_only=True)
    model = transformers.CLIPModel.from_pretrained(args.weights, local_files_only=True).eval().to(args.device)
    image_processor = processor.image_processor
    resize = image_processor.size.get("shortest_edge") or min(image_processor.size.values())
    crop = image_processor.crop_size["height"]
    preprocess = modules["Preprocess"](resize, crop, image_processor.image_mean, image_processor.image_std,
                                       torchvision_crop=False)
    text = []
    with torch.no_grad():
        for chunk in in_batches(prompts, args.batch):
            tokens = processor.tokenizer(chunk, padding=True, truncation=True, max_length=77, return_tensors="pt")
            text.append(model.get_text_features(input_ids=tokens["input_ids"].to(args.device),
                                                attention_mask=tokens["attention_mask"].to(args.device)).float())
    return modules["CosineReward"](preprocess, modules["TransformersImageFeatures"](model), torch.cat(text),
                                   scale_of(model), floor=args.model == "clip")


def hpsv2_reward(torch, modules, args, prompts):
    """HPS v2.1: open_clip's ViT-H-14 (or --open-clip-config's architecture) with the checkpoint's state dict."""
    import open_clip

    arch = "ViT-H-14"
    if args.open_clip_config:
        open_clip.add_model_config(args.open_clip_config)
        arch = os.path.splitext(os.path.basename(args.open_clip_config))[0]
    model = open_clip.create_model(arch, pretrained=None, precision="fp32", device="cpu")
    state = torch.load(args.weights, map_location="cpu")
    if not isinstance(state, dict):
        fail("--weights %s: not a checkpoint (a dict with 'state_dict')" % args.weights)
    try:
        model.load_state_dict(state.get("state_dict", state))
    except RuntimeError as e:
        fail("--weights %s: does not fit open_clip's %s: %s" % (args.weights, arch, str(e).splitlines()[0]))
    model = model.eval().to(args.device)
    tokenizer = open_clip.get_tokenizer(arch)
    size = model.visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    preprocess = modules["Preprocess"](size, size, getattr(model.visual, "image_mean", None) or OPENAI_MEAN,
                                       getattr(model.visual, "image_std", None) or OPENAI_STD, torchvision_crop=True)
    with torch.no_grad():
        text = torch.cat([model.encode_text(tokenizer(chunk).to(args.device)).float()
                          for chunk in in_batches(prompts, args.batch)])
    return modules["CosineReward"](preprocess, model.visual, text, 1.0, floor=False)


def image_reward(torch, modules, args, prompts):
    """ImageReward v1.0 through its package (RM.load reads a file path instead of downloading)."""
    if args.hf_home:
        os.environ["HF_HOME"] = args.hf_home
    import ImageReward as RM

    model = RM.load(args.weights, device=args.device, med_config=args.med_config).eval()
    tokens = model.blip.tokenizer(prompts, padding="max_length", truncation=True, max_length=IMAGE_REWARD_TOKENS,
                                  return_tensors="pt")
    preprocess = modules["Preprocess"](IMAGE_REWARD_SIZE, IMAGE_REWARD_SIZE, OPENAI_MEAN, OPENAI_STD,
                                       torchvision_crop=True)  # BLIP's transform is torchvision's
    return modules["ImageRewardScore"](preprocess, model, tokens.input_ids.to(args.device),
                                       tokens.attention_mask.to(args.device))


def build_scorer(torch, modules, args, prompts):
    if args.model == "hpsv2":
        return hpsv2_reward(torch, modules, args, prompts)
    if args.model == "imagereward":
        return image_reward(torch, modules, args, prompts)
    if args.model == "pickscore":
        return transformers_clip_reward(torch, modules, args, prompts,
                                        lambda model: model.logit_scale.detach().exp().float())
    return transformers_clip_reward(torch, modules, args, prompts, lambda model: args.clip_scale)


# ---- Export -----------------------------------------------------------------------------------------------------

def export(torch, modules, scorer, prompts, args):
    """Traces `scorer`, checks the trace against the eager module on two image sizes (the preprocessing stays
    dynamic), wraps it with the prompt list, saves it and checks the saved file once more."""
    scorer = scorer.eval().to(args.device)
    generator = torch.Generator().manual_seed(0)
    ids = (torch.arange(2) % len(prompts)).to(args.device)
    images = torch.rand(2, 3, args.example_size, args.example_size, generator=generator).to(args.device)
    other = torch.rand(2, 3, args.example_size + 64, args.example_size, generator=generator).to(args.device)
    with torch.no_grad():
        traced = torch.jit.trace(scorer, (images, ids), check_trace=False)
        for example in (images, other):
            torch.testing.assert_close(traced(example, ids), scorer(example, ids), rtol=1e-4, atol=1e-5)
        module = torch.jit.script(modules["PromptListedReward"](traced, prompts))
        temporary = args.out + ".tmp"
        module.save(temporary)
        loaded = torch.jit.load(temporary, map_location=args.device)
        scores = loaded(other, ids)
        torch.testing.assert_close(scores, scorer(other, ids), rtol=1e-4, atol=1e-5)
    os.replace(temporary, args.out)
    print("wrote %s: %s for %d prompts; scores of 2 random images: %s"
          % (args.out, args.model, len(prompts), ", ".join("%.6g" % s for s in scores.tolist())))


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="hpsv2, pickscore, imagereward or clip")
    parser.add_argument("--prompts", required=True, help="the run's prompt-embeddings file or shard directory")
    parser.add_argument("--out", required=True, help="the TorchScript file to write (e.g. hps_v21.pt)")
    parser.add_argument("--weights", required=True, help="hpsv2: HPS_v2.1_compressed.pt; pickscore, clip: the "
                                                         "CLIPModel folder; imagereward: ImageReward.pt")
    parser.add_argument("--processor", help="pickscore: CLIP-ViT-H-14-laion2B-s32B-b79K's processor folder; clip: "
                                            "the processor folder (default --weights)")
    parser.add_argument("--open-clip-config", help="hpsv2: an open_clip model config .json to use instead of "
                                                   "ViT-H-14 (its file name is the architecture's name)")
    parser.add_argument("--clip-scale", type=float, default=100.0, help="clip: the score's scale (torchmetrics: "
                                                                        "100; Hessel et al.'s CLIP-S: 2.5)")
    parser.add_argument("--med-config", help="imagereward: its med_config.json")
    parser.add_argument("--hf-home", help="imagereward: the Hugging Face cache holding bert-base-uncased")
    parser.add_argument("--device", help="torch device (default cuda when available, else cpu)")
    parser.add_argument("--batch", type=int, default=64, help="prompts encoded at once")
    parser.add_argument("--example-size", type=int, default=512, help="side of the random images traced with")
    args = parser.parse_args(argv)
    if args.model not in MODELS:
        fail("--model %s: unknown model (expected %s)" % (args.model, ", ".join(MODELS)))
    given = {flag for flag in ("processor", "open_clip_config", "med_config", "hf_home") if getattr(args, flag)}
    if args.clip_scale != 100.0:
        given.add("clip_scale")
    for flag in sorted(given - set(MODEL_FLAGS[args.model])):
        fail("--%s is not an option of --model %s" % (flag.replace("_", "-"), args.model))
    if args.batch < 1:
        fail("--batch %d: must be at least 1" % args.batch)
    if args.example_size < 8:
        fail("--example-size %d: must be at least 8" % args.example_size)
    needed = [("weights", args.weights)]
    if args.model == "pickscore":
        if not args.processor:
            fail("--model pickscore needs --processor (CLIP-ViT-H-14-laion2B-s32B-b79K's processor folder)")
        needed.append(("processor", args.processor))
    if args.model == "clip" and args.processor:
        needed.append(("processor", args.processor))
    if args.model == "imagereward":
        if not args.med_config:
            fail("--model imagereward needs --med-config (ImageReward's med_config.json)")
        needed.append(("med-config", args.med_config))
        if args.hf_home:
            needed.append(("hf-home", args.hf_home))
    if args.open_clip_config:
        needed.append(("open-clip-config", args.open_clip_config))
    for flag, path in needed:
        if not os.path.exists(path):
            fail("--%s %s: no such file or directory" % (flag, path))
    if args.model in ("pickscore", "clip") and not os.path.isdir(args.weights):
        fail("--weights %s: not a folder (a CLIPModel saved with save_pretrained)" % args.weights)
    if os.path.isdir(args.out):
        fail("--out %s: is a directory" % args.out)
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        fail("--out %s: its folder does not exist" % args.out)
    return args


def main(argv=None):
    args = parse_args(argv)
    package = {"hpsv2": "open_clip", "imagereward": "ImageReward"}.get(args.model, "transformers")
    missing = [name for name in ("torch", "safetensors", package) if importlib.util.find_spec(name) is None]
    if missing:
        fail("%s lacks %s (docs/export_rewards.md names the pip packages)" % (sys.executable, ", ".join(missing)))
    prompts = training_prompts(args.prompts)
    os.environ["HF_HUB_OFFLINE"] = "1"  # local files only: before transformers / huggingface_hub are imported
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    modules = define_modules(torch)
    scorer = build_scorer(torch, modules, args, prompts)
    export(torch, modules, scorer, prompts, args)


if __name__ == "__main__":
    main()
