#!/usr/bin/env python3
"""Tests scripts/export_reward.py on tiny random-weight models built here (no download).

In a temporary folder (or $BRANCHGRPO_EXPORTED_REWARDS, where the C++ check test_export_reward_cpp reads what is
left): a prompt-embeddings file of three prompts, a tiny transformers CLIPModel with a CLIP tokenizer and image
processor made here (PickScore's and the CLIP score's architecture), and a tiny open_clip model (HPS-v2.1's
architecture, registered from a config written here) saved as a {"state_dict": ...} checkpoint. Each exported
module is checked against the original scorer's own Python forward on the same weights:

  pickscore  CLIPModel.get_image_features / get_text_features (the processor's tokens), L2-normalized,
             logit_scale.exp() * dot
  clip       the same, 100 * max(cos, 0) (torchmetrics' CLIPScore)
  hpsv2      open_clip's encode_image / encode_text (its tokenizer), L2-normalized dot

on float images at the model's input size (the module's resize and crop are then the identity: scores agree to
float32 rounding, 1e-5 relative); the module's preprocessing, on float tensors, is checked against the original
8-bit pipelines (CLIPImageProcessor's PIL resize and crop, open_clip's torchvision transform) on larger smooth
images: within 1.5 8-bit levels. The module's embedded prompt list, and the script's one-line refusals of bad
input, are checked too.

ImageReward is not tested: its package hard-codes BLIP's ViT-L (a 300M-parameter random model is no tiny test)
and bert-base-uncased's tokenizer by name, and importing it needs accelerate, datasets and diffusers.

Usage: test_export_reward.py (needs torch, transformers, open_clip_torch, safetensors: scripts/setup.sh)
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

try:
    import open_clip
    import torch
    import torch.nn.functional as F
    from PIL import Image
    from safetensors.torch import save_file
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer
except ImportError as e:
    sys.exit("error: %s: this test needs torch, transformers, open_clip_torch, safetensors and Pillow "
             "(scripts/setup.sh installs them for %s)" % (e, sys.executable))

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "export_reward.py")
sys.path.insert(0, HERE)
from test_export_prompt_embeddings import clip_tokenizer  # noqa: E402  (the tiny CLIP BPE tokenizer)

PROMPTS = ["a red cube on a blue floor", "two cats and a dog", "a green sphere under a tree"]
SIZE = 32  # the tiny models' input side
OPENAI_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_STD = [0.26862954, 0.26130258, 0.27577711]
TINY_OPEN_CLIP = {"embed_dim": 16,
                  "vision_cfg": {"image_size": SIZE, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
                  "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2}}


def unit(x):
    return F.normalize(x.float(), dim=-1)


def write_prompt_file(path, prompts):
    """A prompt-embeddings file of the layout scripts/export_prompt_embeddings.py writes (FLUX-like, tiny)."""
    count = len(prompts)
    save_file({"context": torch.randn(count, 4, 8), "pooled": torch.randn(count, 8)}, path,
              metadata={"prompts": "\n".join(prompts), "family": "flux", "encoder": "t5+clip", "context_in": "8",
                        "vec_in": "8", "text_len": "4"})


def build_transformers_clip(root):
    """A tiny CLIPModel and its processor (the CLIP BPE tokenizer of the embeddings test, a 32-pixel image
    processor with the OpenAI constants), saved in one folder; the processor alone in another (PickScore's
    --processor)."""
    folder, processor_folder = os.path.join(root, "clip"), os.path.join(root, "clip_processor")
    vocab = clip_tokenizer(os.path.join(root, "clip_tokenizer"), os.path.join(root, "clip_bpe"))
    tokenizer = CLIPTokenizer.from_pretrained(os.path.join(root, "clip_tokenizer"))
    images = CLIPImageProcessor(size={"shortest_edge": SIZE}, crop_size={"height": SIZE, "width": SIZE},
                                image_mean=OPENAI_MEAN, image_std=OPENAI_STD)
    processor = CLIPProcessor(image_processor=images, tokenizer=tokenizer)
    text = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                max_position_embeddings=77, bos_token_id=vocab - 2, eos_token_id=vocab - 1, pad_token_id=vocab - 1)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=SIZE, patch_size=8)
    torch.manual_seed(1)
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)).eval()
    with torch.no_grad():
        model.logit_scale.fill_(2.3)  # not CLIP's init value: the module must read it from the weights
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    processor.save_pretrained(processor_folder)
    return folder, processor_folder


def build_open_clip(root):
    """A tiny open_clip model registered from a config file here, saved as HPS's {"state_dict": ...}."""
    config = os.path.join(root, "tiny-hps.json")
    with open(config, "w") as f:
        json.dump(TINY_OPEN_CLIP, f)
    open_clip.add_model_config(config)
    torch.manual_seed(2)
    model = open_clip.create_model("tiny-hps", pretrained=None, precision="fp32", device="cpu").eval()
    checkpoint = os.path.join(root, "hps_tiny.pt")
    torch.save({"state_dict": model.state_dict()}, checkpoint)
    return config, checkpoint


def smooth_8bit_images(height, width, seed, count=3):
    """Smooth random 8-bit RGB images (photo-like, unlike pixel noise) as PIL images and as float [count, 3, H, W]
    in [0, 1] (byte / 255)."""
    low = torch.rand(count, 3, 5, 7, generator=torch.Generator().manual_seed(seed))
    smooth = F.interpolate(low, size=(height, width), mode="bilinear", align_corners=False)
    pixels = (smooth * 255).round().to(torch.uint8)
    return [Image.fromarray(p.permute(1, 2, 0).numpy(), "RGB") for p in pixels], pixels.float() / 255.0


class ExportRewardTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = tempfile.TemporaryDirectory()
        cls.root = cls.scratch.name
        cls.out = os.environ.get("BRANCHGRPO_EXPORTED_REWARDS") or os.path.join(cls.root, "out")
        os.makedirs(cls.out, exist_ok=True)
        cls.prompt_file = os.path.join(cls.out, "prompts.safetensors")
        write_prompt_file(cls.prompt_file, PROMPTS)
        cls.clip_folder, cls.clip_processor = build_transformers_clip(cls.root)
        cls.open_clip_config, cls.hps_checkpoint = build_open_clip(cls.root)
        # The scored rows: every prompt, one twice, one image per row.
        cls.ids = torch.tensor([0, 1, 2, 1, 0])
        cls.images = torch.rand(len(cls.ids), 3, SIZE, SIZE, generator=torch.Generator().manual_seed(3))

    @classmethod
    def tearDownClass(cls):
        cls.scratch.cleanup()

    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)

    def export(self, name, *args):
        out = os.path.join(self.out, name + ".pt")
        run = self.run_script(*args, "--prompts", self.prompt_file, "--out", out, "--device", "cpu",
                              "--example-size", "48")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertTrue(run.stdout.startswith("wrote %s: " % out), run.stdout)
        module = torch.jit.load(out)
        self.assertEqual(list(module.training_prompts), PROMPTS)
        return module

    def check(self, name, module, original, original_pixels):
        """The module's scores against the original scorer's on model-size float images (1e-5 relative), its
        preprocessing against the original 8-bit pipeline on larger ones (one 8-bit level), and the check file the
        C++ test reads."""
        with torch.no_grad():
            scores = module(self.images, self.ids)
            torch.testing.assert_close(scores, original(self.images, self.ids), rtol=1e-5, atol=1e-6)
            # Wide and tall, long sides truncated (42 = int(32 * 60 / 45)), odd crop excesses (43 - 32 = 11).
            for height, width in ((45, 60), (40, 54), (61, 45), (300, 200)):
                pil, floats = smooth_8bit_images(height, width, seed=height)
                pixels = module.scorer.preprocess(floats)
                expected = original_pixels(pil)
                self.assertEqual(pixels.shape, expected.shape)
                level = 1.5 / 255 / min(OPENAI_STD)  # 1.5 8-bit levels in normalized units
                torch.testing.assert_close(pixels, expected, rtol=0, atol=level, msg="%s, %d x %d" % (name, height,
                                                                                                     width))
        save_file({"images": self.images.contiguous(), "prompts": self.ids, "scores": scores.contiguous()},
                  os.path.join(self.out, name + ".check.safetensors"))
        return scores

    # ---- transformers CLIP: PickScore and the CLIP score -----------------------------------------------------

    def transformers_original(self, model_folder, processor_folder, score):
        """The original scoring (PickScore's documented recipe): processor tokens, get_*_features, normalized."""
        model = CLIPModel.from_pretrained(model_folder).eval()
        processor = CLIPProcessor.from_pretrained(processor_folder)
        mean, std = torch.tensor(OPENAI_MEAN).view(1, 3, 1, 1), torch.tensor(OPENAI_STD).view(1, 3, 1, 1)

        def text_features(ids):
            tokens = processor(text=[PROMPTS[i] for i in ids.tolist()], padding=True, truncation=True, max_length=77,
                               return_tensors="pt")
            return unit(model.get_text_features(input_ids=tokens["input_ids"],
                                                attention_mask=tokens["attention_mask"]))

        def on_floats(images, ids):  # images already SIZE x SIZE: the processor's resize and crop do nothing
            image = unit(model.get_image_features(pixel_values=(images - mean) / std))
            return score(model, (image * text_features(ids)).sum(-1))

        def pixels_8bit(pil):
            return processor(images=pil, return_tensors="pt")["pixel_values"]

        return on_floats, pixels_8bit

    def test_pickscore(self):
        module = self.export("pickscore", "--model", "pickscore", "--weights", self.clip_folder, "--processor",
                             self.clip_processor)
        original = self.transformers_original(self.clip_folder, self.clip_processor,
                                              lambda model, cosine: model.logit_scale.exp() * cosine)
        scores = self.check("pickscore", module, *original)
        self.assertGreater(float(scores.abs().max()), 1e-3)

    def test_clip_score(self):
        module = self.export("clip", "--model", "clip", "--weights", self.clip_folder)
        original = self.transformers_original(self.clip_folder, self.clip_folder,
                                              lambda model, cosine: 100.0 * cosine.clamp(min=0.0))
        self.check("clip", module, *original)

    # ---- open_clip: HPS-v2.1 ---------------------------------------------------------------------------------

    def test_hpsv2(self):
        module = self.export("hpsv2", "--model", "hpsv2", "--weights", self.hps_checkpoint, "--open-clip-config",
                             self.open_clip_config)
        model, _, preprocess = open_clip.create_model_and_transforms("tiny-hps", pretrained=None, precision="fp32")
        model.load_state_dict(torch.load(self.hps_checkpoint)["state_dict"])
        model.eval()
        tokenizer = open_clip.get_tokenizer("tiny-hps")
        mean, std = torch.tensor(OPENAI_MEAN).view(1, 3, 1, 1), torch.tensor(OPENAI_STD).view(1, 3, 1, 1)

        def text_features(ids):
            return unit(model.encode_text(tokenizer([PROMPTS[i] for i in ids.tolist()])))

        def on_floats(images, ids):
            return (unit(model.encode_image((images - mean) / std)) * text_features(ids)).sum(-1)

        def pixels_8bit(pil):
            return torch.stack([preprocess(image) for image in pil])

        self.check("hpsv2", module, on_floats, pixels_8bit)

    # ---- The prompt list and bad input ------------------------------------------------------------------------

    def test_shard_directory_prompts(self):
        spec = importlib.util.spec_from_file_location("export_reward", SCRIPT)
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        shards = os.path.join(self.root, "shards")
        os.makedirs(shards)
        write_prompt_file(os.path.join(shards, "p-00002-of-00002.safetensors"), PROMPTS[2:])
        write_prompt_file(os.path.join(shards, "p-00001-of-00002.safetensors"), PROMPTS[:2])
        self.assertEqual(script.training_prompts(shards), PROMPTS)

    def refused(self, message, *args):
        out = os.path.join(self.root, "refused.pt")
        run = self.run_script(*args, "--out", out, "--device", "cpu")
        self.assertEqual((run.returncode, run.stdout, run.stderr), (1, "", "error: " + message + "\n"))
        self.assertFalse(os.path.exists(out))

    def test_bad_input(self):
        prompts = ["--prompts", self.prompt_file]
        self.refused("--model vqa: unknown model (expected hpsv2, pickscore, imagereward, clip)", "--model", "vqa",
                     "--weights", self.clip_folder, *prompts)
        missing = os.path.join(self.root, "missing")
        self.refused("--weights %s: no such file or directory" % missing, "--model", "hpsv2", "--weights", missing,
                     *prompts)
        self.refused("--model pickscore needs --processor (CLIP-ViT-H-14-laion2B-s32B-b79K's processor folder)",
                     "--model", "pickscore", "--weights", self.clip_folder, *prompts)
        self.refused("--open-clip-config is not an option of --model clip", "--model", "clip", "--weights",
                     self.clip_folder, "--open-clip-config", self.open_clip_config, *prompts)
        self.refused("--prompts %s: no such file or directory" % missing, "--model", "clip", "--weights",
                     self.clip_folder, "--prompts", missing)
        text = os.path.join(self.root, "prompts.txt")
        with open(text, "w") as f:
            f.write("\n".join(PROMPTS) + "\n")
        run = self.run_script("--model", "clip", "--weights", self.clip_folder, "--prompts", text, "--out",
                              os.path.join(self.root, "refused.pt"))
        self.assertEqual(run.returncode, 1)
        self.assertTrue(run.stderr.startswith("error: %s: not a safetensors file (" % text), run.stderr)
        self.assertEqual(run.stderr.count("\n"), 1, run.stderr)
        plain = os.path.join(self.root, "plain.safetensors")
        save_file({"context": torch.zeros(1, 2, 3)}, plain)
        self.refused("%s: no __metadata__ key 'prompts': not a prompt-embeddings file "
                     "(scripts/export_prompt_embeddings.py writes one)" % plain, "--model", "clip", "--weights",
                     self.clip_folder, "--prompts", plain)


if __name__ == "__main__":
    unittest.main()
