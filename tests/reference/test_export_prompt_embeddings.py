#!/usr/bin/env python3
"""Tests scripts/export_prompt_embeddings.py on tiny random-weight encoders built here (no download).

In a temporary folder: a FLUX-like repository (text_encoder / tokenizer: CLIPTextModel and a CLIP BPE tokenizer
written from a vocabulary and merges made here; text_encoder_2 / tokenizer_2: T5EncoderModel and a unigram
tokenizer trained here), a Wan-like one (text_encoder / tokenizer: UMT5EncoderModel and the same kind of
unigram tokenizer) and an SD3-like one (text_encoder / tokenizer and text_encoder_2 / tokenizer_2: two
CLIPTextModelWithProjection of different widths with CLIP BPE tokenizers, the second padding with "!" as SD3's
CLIP-G tokenizer does; text_encoder_3 / tokenizer_3: T5EncoderModel and a unigram tokenizer). The script runs as a
command on text and JSONL prompt files; every row of what it writes is checked against the encoders run here,
prompt by prompt: FLUX's T5 and CLIP outputs on the padded tokens, Wan's umT5 output on the real tokens alone
followed by exact zeros, SD3's against diffusers' own StableDiffusion3Pipeline.encode_prompt on the same encoders
(where diffusers is installed; else against encode_prompt's formula written out here). Bad input is one line naming
file:line, exit 1.

Usage: test_export_prompt_embeddings.py [ExportTest.test_sd3] (needs torch, transformers, tokenizers, safetensors:
scripts/setup.sh; diffusers for the SD3 pipeline: the project's .venv)
"""
import html
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import unittest

try:
    import torch
    from safetensors import safe_open
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import (AutoTokenizer, CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection,
                              CLIPTokenizer, T5Config, T5EncoderModel, T5TokenizerFast, UMT5Config, UMT5EncoderModel)
except ImportError as e:
    sys.exit("error: %s: this test needs torch, transformers, tokenizers and safetensors (scripts/setup.sh "
             "installs them for %s)" % (e, sys.executable))
try:
    from ftfy import fix_text
except ImportError:
    fix_text = None
try:  # the SD3 case compares with diffusers' own pipeline where diffusers is installed
    from diffusers import StableDiffusion3Pipeline
except ImportError:
    StableDiffusion3Pipeline = None

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                      "export_prompt_embeddings.py")
# Wan2.1's default negative prompt, as its shared config (wan/configs/shared_config.py) writes it.
WAN_NEGATIVE = ("色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，JPEG压缩残留，"
                "丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，手指融合，"
                "静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走")
WORDS = ["a", "red", "cube", "on", "blue", "floor", "green", "sphere", "blurry", "dark", "two", "cats", "and",
         "dog", "under", "tree"]
T5_WIDTH, CLIP_WIDTH, FLUX_LENGTH, WAN_LENGTH = 32, 16, 24, 512
# SD3: CLIP-L and CLIP-G widths (their 16 + 24 features zero-padded to T5's 48), projections (the pooled 8 + 12) and
# the T5 tokens after the 77 CLIP tokens.
SD3_CLIP_WIDTHS, SD3_PROJECTIONS, SD3_T5_WIDTH, SD3_LENGTH = (16, 24), (8, 12), 48, 20


def unigram_tokenizer(folder):
    """A T5-style unigram tokenizer (<pad> 0, </s> 1, <unk> 2, "$A </s>") trained on WORDS and WAN_NEGATIVE."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=160, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>")
    tokenizer.train_from_iterator([" ".join(WORDS), WAN_NEGATIVE], trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                             special_tokens=[("</s>", 1)])
    fast = T5TokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                           extra_ids=0, model_max_length=512)
    fast.save_pretrained(folder)
    return len(fast)


def clip_tokenizer(folder, scratch, pad_token="<|endoftext|>"):
    """A CLIP BPE tokenizer: letters, their word-final forms, WORDS merged left to right, the two specials last."""
    letters = "abcdefghijklmnopqrstuvwxyz0123456789.,!&;"
    vocab = list(letters) + [c + "</w>" for c in letters]
    merges = []
    for word in WORDS:
        pieces = list(word[:-1]) + [word[-1] + "</w>"]
        while len(pieces) > 1:
            merges.append(pieces[0] + " " + pieces[1])
            pieces = [pieces[0] + pieces[1]] + pieces[2:]
            if pieces[0] not in vocab:
                vocab.append(pieces[0])
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    os.makedirs(scratch)
    with open(os.path.join(scratch, "vocab.json"), "w") as f:
        json.dump({token: i for i, token in enumerate(vocab)}, f)
    with open(os.path.join(scratch, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n" + "\n".join(dict.fromkeys(merges)) + "\n")
    CLIPTokenizer(os.path.join(scratch, "vocab.json"), os.path.join(scratch, "merges.txt"), pad_token=pad_token,
                  model_max_length=77).save_pretrained(folder)
    return len(vocab)


def build_repositories(root):
    torch.manual_seed(0)
    flux, wan = os.path.join(root, "flux"), os.path.join(root, "wan")
    vocab = clip_tokenizer(os.path.join(flux, "tokenizer"), os.path.join(root, "clip_source"))
    CLIPTextModel(CLIPTextConfig(vocab_size=vocab, hidden_size=CLIP_WIDTH, intermediate_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, max_position_embeddings=77, bos_token_id=vocab - 2,
                                 eos_token_id=vocab - 1, pad_token_id=vocab - 1)).save_pretrained(
        os.path.join(flux, "text_encoder"))
    t5_shape = dict(d_model=T5_WIDTH, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
                    pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    vocab = unigram_tokenizer(os.path.join(flux, "tokenizer_2"))
    T5EncoderModel(T5Config(vocab_size=vocab, **t5_shape)).save_pretrained(os.path.join(flux, "text_encoder_2"))
    vocab = unigram_tokenizer(os.path.join(wan, "tokenizer"))
    UMT5EncoderModel(UMT5Config(vocab_size=vocab, **t5_shape)).save_pretrained(os.path.join(wan, "text_encoder"))
    sd3 = os.path.join(root, "sd3")
    for k, suffix in enumerate(("", "_2")):
        vocab = clip_tokenizer(os.path.join(sd3, "tokenizer" + suffix), os.path.join(root, "sd3_clip_source" + suffix),
                               pad_token="!" if suffix else "<|endoftext|>")
        CLIPTextModelWithProjection(CLIPTextConfig(
            vocab_size=vocab, hidden_size=SD3_CLIP_WIDTHS[k], intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=2, max_position_embeddings=77, projection_dim=SD3_PROJECTIONS[k],
            bos_token_id=vocab - 2, eos_token_id=vocab - 1, pad_token_id=vocab - 1)).save_pretrained(
            os.path.join(sd3, "text_encoder" + suffix))
    vocab = unigram_tokenizer(os.path.join(sd3, "tokenizer_3"))
    T5EncoderModel(T5Config(vocab_size=vocab, **dict(t5_shape, d_model=SD3_T5_WIDTH))).save_pretrained(
        os.path.join(sd3, "text_encoder_3"))
    return flux, wan, sd3


def read(path):
    with safe_open(path, "pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}, f.metadata()


def wan_clean(text):
    """Wan2.1's prompt cleaning: ftfy.fix_text (where installed), HTML unescaped twice, whitespace collapsed."""
    if fix_text is not None:
        text = fix_text(text)
    return re.sub(r"\s+", " ", html.unescape(html.unescape(text)).strip()).strip()


class ExportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = tempfile.TemporaryDirectory()
        cls.root = cls.scratch.name
        cls.flux, cls.wan, cls.sd3 = build_repositories(cls.root)
        cls.models = {}

    @classmethod
    def tearDownClass(cls):
        cls.scratch.cleanup()

    def model(self, cls, folder, dtype):
        key = (folder, dtype)
        if key not in self.models:
            self.models[key] = cls.from_pretrained(folder, torch_dtype=dtype).eval()
        return self.models[key]

    def write(self, name, lines):
        path = os.path.join(self.root, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
        return path

    def export(self, *args):
        out = os.path.join(self.root, "out_%d.safetensors" % len(os.listdir(self.root)))
        run = subprocess.run([sys.executable, SCRIPT, *args, "--out", out, "--device", "cpu"], capture_output=True,
                             text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertTrue(run.stdout.startswith("wrote %s: context [" % out), run.stdout)
        return read(out)

    def refused(self, message, *args):
        out = os.path.join(self.root, "refused.safetensors")
        run = subprocess.run([sys.executable, SCRIPT, *args, "--out", out, "--device", "cpu"], capture_output=True,
                             text=True)
        self.assertEqual((run.returncode, run.stdout, run.stderr), (1, "", "error: " + message + "\n"))
        self.assertFalse(os.path.exists(out))

    # What the FLUX pipeline computes for one prompt: T5 on max-length padded tokens and CLIP's pooled output on
    # 77 padded tokens, neither with an attention mask.
    def flux_expected(self, text, dtype):
        t5_tokenizer = T5TokenizerFast.from_pretrained(os.path.join(self.flux, "tokenizer_2"))
        ids = t5_tokenizer([text], padding="max_length", max_length=FLUX_LENGTH, truncation=True,
                           return_tensors="pt").input_ids
        self.assertEqual(ids.shape, (1, FLUX_LENGTH))
        clip_tokenizer = CLIPTokenizer.from_pretrained(os.path.join(self.flux, "tokenizer"))
        clip_ids = clip_tokenizer([text], padding="max_length", max_length=77, truncation=True,
                                  return_tensors="pt").input_ids
        with torch.no_grad():
            context = self.model(T5EncoderModel, os.path.join(self.flux, "text_encoder_2"), dtype)(ids)[0][0]
            pooled = self.model(CLIPTextModel, os.path.join(self.flux, "text_encoder"), dtype)(clip_ids)[1][0]
        return context.float(), pooled.float()

    # What Wan2.1 computes for one prompt: umT5 on the cleaned prompt's real tokens (with </s>) alone, then zeros
    # up to text_len.
    def wan_expected(self, text):
        tokenizer = AutoTokenizer.from_pretrained(os.path.join(self.wan, "tokenizer"))
        ids = tokenizer([wan_clean(text)], add_special_tokens=True, return_tensors="pt").input_ids
        self.assertEqual(ids[0, -1].item(), 1)
        with torch.no_grad():
            hidden = self.model(UMT5EncoderModel, os.path.join(self.wan, "text_encoder"), torch.float32)(ids)[0][0]
        return hidden, ids.shape[1]

    def check_wan_row(self, row, text):
        expected, length = self.wan_expected(text)
        self.assertEqual(row.shape, (WAN_LENGTH, T5_WIDTH))
        torch.testing.assert_close(row[:length], expected, atol=1e-5, rtol=1e-5)
        self.assertTrue(bool((row[length - 1] != 0).any()))
        self.assertTrue(bool((row[length:] == 0).all()))

    def test_flux_text_file(self):
        prompts = ["a red cube on a blue floor", "two cats and a dog", "a green sphere under a tree"]
        path = self.write("flux.txt", [prompts[0], "", "   ", prompts[1], prompts[2]])
        tensors, metadata = self.export("--model", "flux", "--prompts", path, "--repo", self.flux, "--dtype", "f32",
                                        "--max-length", str(FLUX_LENGTH), "--batch", "2")
        self.assertEqual(sorted(tensors), ["context", "pooled"])
        self.assertEqual(tensors["context"].dtype, torch.float32)
        self.assertEqual(tensors["context"].shape, (3, FLUX_LENGTH, T5_WIDTH))
        self.assertEqual(tensors["pooled"].shape, (3, CLIP_WIDTH))
        source = ", ".join("%s=%s/%s" % (name, self.flux, name)
                           for name in ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2"))
        self.assertEqual(metadata, {"prompts": "\n".join(prompts), "family": "flux", "encoder": "t5+clip",
                                    "encoder_source": source, "context_in": str(T5_WIDTH),
                                    "vec_in": str(CLIP_WIDTH), "text_len": str(FLUX_LENGTH)})
        for row, text in enumerate(prompts):
            context, pooled = self.flux_expected(text, torch.float32)
            torch.testing.assert_close(tensors["context"][row], context, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(tensors["pooled"][row], pooled, atol=1e-5, rtol=1e-5)

    def test_flux_jsonl_negatives_bf16(self):
        rows = [{"prompt": "a red cube", "negative_prompt": "blurry"}, {"prompt": "a blue sphere"},
                {"prompt": "two cats", "negative_prompt": "blurry", "seed": 3},
                {"prompt": "a dog", "negative_prompt": "dark"}]
        path = self.write("flux.jsonl", [json.dumps(row) for row in rows])
        tensors, metadata = self.export("--model", "flux", "--prompts", path, "--repo", self.flux,
                                        "--max-length", str(FLUX_LENGTH), "--out-dtype", "bf16")
        self.assertEqual(sorted(tensors), ["context", "negative_context", "negative_index", "negative_pooled",
                                           "pooled"])
        self.assertEqual(metadata["negative_prompts"], "blurry\n\ndark")
        self.assertEqual(metadata["prompts"], "a red cube\na blue sphere\ntwo cats\na dog")
        self.assertEqual(tensors["negative_index"].dtype, torch.int64)
        self.assertEqual(tensors["negative_index"].tolist(), [0, 1, 0, 2])
        self.assertEqual(tensors["negative_context"].shape, (3, FLUX_LENGTH, T5_WIDTH))
        self.assertEqual(tensors["negative_pooled"].shape, (3, CLIP_WIDTH))
        for name in ("context", "pooled", "negative_context", "negative_pooled"):
            self.assertEqual(tensors[name].dtype, torch.bfloat16, name)
        # bf16 encoders (the default --dtype), stored as bf16: equal to a bf16 run here within bf16 rounding.
        for prefix, texts in (("", [row["prompt"] for row in rows]), ("negative_", ["blurry", "", "dark"])):
            for row, text in enumerate(texts):
                context, pooled = self.flux_expected(text, torch.bfloat16)
                torch.testing.assert_close(tensors[prefix + "context"][row].float(), context, atol=3e-2, rtol=2e-2)
                torch.testing.assert_close(tensors[prefix + "pooled"][row].float(), pooled, atol=3e-2, rtol=2e-2)

    def test_wan_text_file(self):
        prompts = ["a  red&amp;amp;blue\tcube ", "two cats and a dog under a tree " * 3, "a"]
        path = self.write("wan.txt", prompts)
        tokenizer, encoder = os.path.join(self.wan, "tokenizer"), os.path.join(self.wan, "text_encoder")
        tensors, metadata = self.export("--model", "wan", "--prompts", path, "--text-encoder", encoder,
                                        "--tokenizer", tokenizer, "--dtype", "f32", "--batch", "2")
        self.assertEqual(sorted(tensors), ["context"])
        self.assertEqual(tensors["context"].shape, (3, WAN_LENGTH, T5_WIDTH))
        self.assertEqual(metadata, {"prompts": "\n".join(prompts), "family": "wan", "encoder": "umt5",
                                    "encoder_source": "text_encoder=%s, tokenizer=%s" % (encoder, tokenizer),
                                    "context_in": str(T5_WIDTH), "text_len": str(WAN_LENGTH)})
        self.assertEqual(wan_clean(prompts[0]), "a red&blue cube")
        for row, text in enumerate(prompts):
            self.check_wan_row(tensors["context"][row], text)
        # The padding positions would change the real tokens' features without the attention mask.
        ids = AutoTokenizer.from_pretrained(tokenizer)([wan_clean(prompts[2])], padding="max_length",
                                                       max_length=WAN_LENGTH, return_tensors="pt").input_ids
        with torch.no_grad():
            unmasked = self.model(UMT5EncoderModel, encoder, torch.float32)(ids)[0][0]
        _, length = self.wan_expected(prompts[2])
        self.assertGreater((unmasked[:length] - tensors["context"][2][:length]).abs().max().item(), 1e-3)

    def test_wan_jsonl_default_negative(self):
        rows = [{"prompt": "a red cube"}, {"prompt": "a green sphere", "negative_prompt": "blurry  dark"},
                {"prompt": "two cats"}]
        path = self.write("wan.jsonl", [json.dumps(row, ensure_ascii=False) for row in rows])
        tensors, metadata = self.export("--model", "wan", "--prompts", path, "--repo", self.wan, "--dtype", "f32",
                                        "--negative-prompt", "default")
        self.assertEqual(sorted(tensors), ["context", "negative_context", "negative_index"])
        self.assertEqual(metadata["negative_prompts"], WAN_NEGATIVE + "\nblurry  dark")
        self.assertEqual(metadata["encoder_source"], "text_encoder=%s/text_encoder, tokenizer=%s/tokenizer"
                         % (self.wan, self.wan))
        self.assertEqual(tensors["negative_index"].tolist(), [0, 1, 0])
        self.assertEqual(tensors["negative_context"].shape, (2, WAN_LENGTH, T5_WIDTH))
        for row, text in enumerate(row["prompt"] for row in rows):
            self.check_wan_row(tensors["context"][row], text)
        # ftfy turns the default's full-width commas into ASCII ones before Wan2.1 tokenizes it.
        self.assertEqual("，" in wan_clean(WAN_NEGATIVE), fix_text is None)
        for row, text in enumerate([WAN_NEGATIVE, "blurry  dark"]):
            self.check_wan_row(tensors["negative_context"][row], text)

    # encode_prompt's formula (diffusers' pipeline_stable_diffusion_3.py, clip_skip None), for a python without
    # diffusers: each CLIP's hidden_states[-2] and text_embeds on 77 padded tokens, T5 on SD3_LENGTH padded tokens.
    def sd3_formula_features(self, texts):
        tokens, pooled = [], []
        for suffix in ("", "_2"):
            ids = CLIPTokenizer.from_pretrained(os.path.join(self.sd3, "tokenizer" + suffix))(
                texts, padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
            encoder = self.model(CLIPTextModelWithProjection, os.path.join(self.sd3, "text_encoder" + suffix),
                                 torch.float32)
            with torch.no_grad():
                out = encoder(ids, output_hidden_states=True)
            tokens.append(out.hidden_states[-2])
            pooled.append(out.text_embeds)
        ids = T5TokenizerFast.from_pretrained(os.path.join(self.sd3, "tokenizer_3"))(
            texts, padding="max_length", max_length=SD3_LENGTH, truncation=True, return_tensors="pt").input_ids
        with torch.no_grad():
            t5 = self.model(T5EncoderModel, os.path.join(self.sd3, "text_encoder_3"), torch.float32)(ids)[0]
        clip = torch.cat(tokens, dim=-1)
        clip = torch.cat([clip, clip.new_zeros(clip.shape[0], clip.shape[1], t5.shape[-1] - clip.shape[-1])], dim=-1)
        return torch.cat([clip, t5], dim=1), torch.cat(pooled, dim=-1)

    # What diffusers' StableDiffusion3Pipeline.encode_prompt computes for `texts` (guidance on, so the negatives
    # too: `negative`, or the pipeline's default "" when None), on the encoders of the SD3-like repository.
    def sd3_pipeline_features(self, texts, negative):
        if StableDiffusion3Pipeline is None:
            negatives = negative or [""] * len(texts)
            return (*self.sd3_formula_features(texts), *self.sd3_formula_features(negatives))
        tokenizers = {name: CLIPTokenizer.from_pretrained(os.path.join(self.sd3, name))
                      for name in ("tokenizer", "tokenizer_2")}
        encoders = {name: self.model(CLIPTextModelWithProjection, os.path.join(self.sd3, name), torch.float32)
                    for name in ("text_encoder", "text_encoder_2")}
        pipe = StableDiffusion3Pipeline(
            transformer=None, scheduler=None, vae=None, **tokenizers, **encoders,
            tokenizer_3=T5TokenizerFast.from_pretrained(os.path.join(self.sd3, "tokenizer_3")),
            text_encoder_3=self.model(T5EncoderModel, os.path.join(self.sd3, "text_encoder_3"), torch.float32))
        with torch.no_grad():
            context, negative_context, pooled, negative_pooled = pipe.encode_prompt(
                prompt=texts, prompt_2=None, prompt_3=None, device="cpu", do_classifier_free_guidance=True,
                negative_prompt=negative, max_sequence_length=SD3_LENGTH)
        return context, pooled, negative_context, negative_pooled

    def test_sd3(self):
        # Guided with the default negative: the pipeline's `negative_prompt or ""`, the empty prompt encoded.
        prompts = ["a red cube on a blue floor", "two cats and a dog under a tree " * 4, "a"]
        path = self.write("sd3.txt", prompts)
        tensors, metadata = self.export("--model", "sd3", "--prompts", path, "--repo", self.sd3, "--dtype", "f32",
                                        "--max-length", str(SD3_LENGTH), "--batch", "3", "--negative-prompt",
                                        "default")
        self.assertEqual(sorted(tensors), ["context", "negative_context", "negative_index", "negative_pooled",
                                           "pooled"])
        length, pooled_width = 77 + SD3_LENGTH, sum(SD3_PROJECTIONS)
        self.assertEqual(tensors["context"].shape, (3, length, SD3_T5_WIDTH))
        self.assertEqual(tensors["pooled"].shape, (3, pooled_width))
        self.assertEqual(tensors["negative_context"].shape, (1, length, SD3_T5_WIDTH))
        self.assertEqual(tensors["negative_index"].tolist(), [0, 0, 0])
        source = ", ".join(f"{name}={self.sd3}/{name}" for name in ("text_encoder", "tokenizer", "text_encoder_2",
                                                                      "tokenizer_2", "text_encoder_3", "tokenizer_3"))
        self.assertEqual(metadata, {"prompts": "\n".join(prompts), "family": "sd3", "encoder": "clip-l+clip-g+t5",
                                    "encoder_source": source, "context_in": str(SD3_T5_WIDTH),
                                    "vec_in": str(pooled_width), "text_len": str(length), "negative_prompts": ""})
        context, pooled, negative_context, negative_pooled = self.sd3_pipeline_features(prompts, None)
        torch.testing.assert_close(tensors["context"], context, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(tensors["pooled"], pooled, atol=1e-6, rtol=1e-6)
        # The pipeline encodes its negative once per prompt; the file holds the one distinct negative.
        torch.testing.assert_close(tensors["negative_context"][0], negative_context[0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(tensors["negative_pooled"][0], negative_pooled[0], atol=1e-6, rtol=1e-6)
        # The layout the pipeline builds: CLIP's 77 tokens zero-padded past 16 + 24 features, then T5's tokens;
        # the empty prompt's features are not zeros.
        self.assertTrue(bool((tensors["context"][:, :77, sum(SD3_CLIP_WIDTHS):] == 0).all()))
        self.assertTrue(bool((tensors["context"][:, 77:, sum(SD3_CLIP_WIDTHS):] != 0).any()))
        self.assertGreater(tensors["negative_context"].abs().max().item(), 0.1)

        # Each component named on its own (-2: CLIP-G, -3: T5), JSONL rows with their own negatives, batches of 2.
        rows = [{"prompt": "a green sphere", "negative_prompt": "blurry"}, {"prompt": "a dog"}]
        path = self.write("sd3.jsonl", [json.dumps(row) for row in rows])
        flags = [f"--{name.replace('_', '-')}={os.path.join(self.sd3, name)}"
                 for name in ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "text_encoder_3",
                              "tokenizer_3")]
        tensors, metadata = self.export("--model", "sd3", "--prompts", path, *flags, "--dtype", "f32",
                                        "--max-length", str(SD3_LENGTH), "--batch", "2")
        self.assertEqual(metadata["negative_prompts"], "blurry\n")
        self.assertTrue(metadata["encoder_source"].startswith(f"text_encoder={self.sd3}/text_encoder, "))
        context, pooled, negative_context, negative_pooled = self.sd3_pipeline_features(
            [row["prompt"] for row in rows], ["blurry", ""])
        torch.testing.assert_close(tensors["context"], context, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(tensors["pooled"], pooled, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(tensors["negative_context"], negative_context, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(tensors["negative_pooled"], negative_pooled, atol=1e-6, rtol=1e-6)

    def test_shards_and_split(self):
        # 7 prompts, 2 held out by seed 3, the other 5 in shards of 2: 3 shards, each a file of the layout with the
        # negatives its rows use; the rows equal an unsharded export's.
        rows = [{"prompt": "p%d" % k} for k in range(7)]
        rows[4]["negative_prompt"] = "blurry"
        path = self.write("shards.jsonl", [json.dumps(row) for row in rows])
        train, test = os.path.join(self.root, "train"), os.path.join(self.root, "test")
        # --batch 1: each prompt encoded alone in both exports. A batch of other rows changes the matrix shapes,
        # and so BLAS's blocking and the last bits of the features (1e-6 seen), not the rows' meaning.
        common = ["--model", "wan", "--prompts", path, "--repo", self.wan, "--dtype", "f32", "--device", "cpu",
                  "--negative-prompt", "dark", "--batch", "1"]
        run = subprocess.run([sys.executable, SCRIPT, *common, "--out", train, "--shard-rows", "2", "--test-count",
                              "2", "--test-out", test, "--split-seed", "3"], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        held_out = sorted(random.Random(3).sample(range(7), 2))
        trained = [k for k in range(7) if k not in held_out]
        self.assertEqual(sorted(os.listdir(train)), ["prompts-00001-of-00003.safetensors",
                                                     "prompts-00002-of-00003.safetensors",
                                                     "prompts-00003-of-00003.safetensors"])
        self.assertEqual(os.listdir(test), ["prompts-00001-of-00001.safetensors"])
        whole, _ = self.export(*common)
        seen = []
        for name in sorted(os.listdir(train)):
            tensors, metadata = read(os.path.join(train, name))
            texts = metadata["prompts"].split("\n")
            seen += texts
            for row, text in enumerate(texts):
                torch.testing.assert_close(tensors["context"][row], whole["context"][int(text[1:])], atol=0, rtol=0)
                negative = rows[int(text[1:])].get("negative_prompt", "dark")
                k = metadata["negative_prompts"].split("\n").index(negative)
                self.assertEqual(tensors["negative_index"][row].item(), k)
                self.check_wan_row(tensors["negative_context"][k], negative)
        self.assertEqual(seen, ["p%d" % k for k in trained])
        tensors, metadata = read(os.path.join(test, "prompts-00001-of-00001.safetensors"))
        self.assertEqual(metadata["prompts"], "\n".join("p%d" % k for k in held_out))
        # A shard directory that already holds shards is refused: stale shards would join the dataset.
        again = subprocess.run([sys.executable, SCRIPT, *common, "--out", train, "--shard-rows", "2"],
                               capture_output=True, text=True)
        self.assertEqual((again.returncode, again.stderr), (1, "error: %s: --out already holds .safetensors files (a "
                                                              "shard directory holds one dataset's shards)\n" % train))
        self.refused("--test-count and --test-out go together", *common, "--test-count", "2")
        self.refused("--test-count = 7: %s holds 7 prompts, and training needs at least one" % path, *common,
                     "--test-count", "7", "--test-out", os.path.join(self.root, "t7.safetensors"))

    def test_bad_input(self):
        missing = self.write("missing.jsonl", ['{"prompt": "a cube"}', '{"negative_prompt": "dark"}'])
        self.refused('%s:2: no "prompt"' % missing, "--model", "wan", "--prompts", missing)
        newline = self.write("newline.jsonl", ['{"prompt": "a cube"}', "", '{"prompt": "a\\nb"}'])
        self.refused("%s:3: the prompt holds a newline" % newline, "--model", "flux", "--prompts", newline)
        negative = self.write("negative.jsonl", ['{"prompt": "a", "negative_prompt": "dark\\nblurry"}'])
        self.refused("%s:1: the negative prompt holds a newline" % negative, "--model", "wan", "--prompts", negative)
        carriage = os.path.join(self.root, "carriage.txt")
        with open(carriage, "w", newline="") as f:
            f.write("a cube\na\rb\n")
        self.refused("%s:2: the prompt holds a newline" % carriage, "--model", "flux", "--prompts", carriage)
        empty = self.write("empty.txt", ["", "  "])
        self.refused("%s: holds no prompts" % empty, "--model", "flux", "--prompts", empty)
        self.refused("%s: holds no prompts" % self.write("empty.jsonl", []), "--model", "wan", "--prompts",
                     os.path.join(self.root, "empty.jsonl"))
        not_json = self.write("not_json.jsonl", ['{"prompt": "a"}', "a cube"])
        self.refused("%s:2: not JSON (Expecting value)" % not_json, "--model", "wan", "--prompts", not_json)
        not_text = self.write("not_text.jsonl", ['{"prompt": 3}'])
        self.refused('%s:1: "prompt" is not a string' % not_text, "--model", "wan", "--prompts", not_text)
        good = self.write("good.txt", ["a cube"])
        self.refused("--negative-prompt default is Wan2.1's default negative prompt; FLUX.1 has none",
                     "--model", "flux", "--prompts", good, "--negative-prompt", "default")
        self.refused("--max-length is Wan2.1's text_len, 512", "--model", "wan", "--prompts", good,
                     "--max-length", "256")
        self.refused("--text-encoder-3 and --tokenizer-3 are SD3's T5; flux has no third text encoder", "--model",
                     "flux", "--prompts", good, "--tokenizer-3", self.sd3)


if __name__ == "__main__":
    unittest.main(verbosity=2)
