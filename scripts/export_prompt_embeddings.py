#!/usr/bin/env python3
"""Encode prompts with FLUX.1's, Wan2.1's or SD3.5's text encoders and write a branchgrpo prompt-embeddings file.

branchgrpo runs no text encoder itself: it reads per-prompt text features from a safetensors file
(docs/prompt_embeddings.md). This script makes that file from a list of prompts, for users who have PyTorch,
transformers and the encoder weights, encoding exactly as each model's own pipeline does:

  --model flux  T5-v1.1-XXL last_hidden_state of the prompt padded / truncated to --max-length tokens, no
                attention mask, and the CLIP ViT-L/14 pooler_output at 77 tokens, padded, no attention mask.
                Weights: --repo (default black-forest-labs/FLUX.1-dev), subfolders text_encoder / tokenizer
                (CLIP) and text_encoder_2 / tokenizer_2 (T5).
  --model wan   umT5-XXL as Wan2.1 encodes it: the prompt cleaned (ftfy.fix_text when ftfy is installed, HTML
                entities unescaped twice, whitespace runs collapsed to one space, ends stripped), tokenized
                with the end token and padded to text_len = 512 tokens, encoded with the attention mask,
                then each row kept on its real tokens and set to exact zeros after them. No pooled vector.
                Weights: --repo (default Wan-AI/Wan2.1-T2V-1.3B-Diffusers), subfolders text_encoder /
                tokenizer.
  --model sd3   as diffusers' StableDiffusion3Pipeline.encode_prompt (clip_skip None): CLIP-L and CLIP-G
                (CLIPTextModelWithProjection) each on the prompt padded / truncated to 77 tokens, no attention
                mask, their hidden_states[-2] concatenated on features (768 + 1280) and zero-padded to T5's
                width 4096, then T5-v1.1-XXL's last_hidden_state of the prompt padded / truncated to --max-length
                (the pipeline's max_sequence_length, default 256) tokens appended along the sequence: context
                [77 + max_length, 4096]. pooled = concat(CLIP-L text_embeds, CLIP-G text_embeds), 2048.
                Weights: --repo (default stabilityai/stable-diffusion-3.5-medium), subfolders text_encoder /
                tokenizer (CLIP-L), text_encoder_2 / tokenizer_2 (CLIP-G), text_encoder_3 / tokenizer_3 (T5).
--text-encoder / --tokenizer (and --text-encoder-2 / --tokenizer-2 for FLUX's T5 and SD3's CLIP-G,
--text-encoder-3 / --tokenizer-3 for SD3's T5) name a folder or repository id holding that one component instead
(no subfolder).

Layout written:
  tensor "context"           [N, L, D]   F32 (BF16 with --out-dtype bf16); D 4096, L --max-length (FLUX),
                                         512 (Wan) or 77 + --max-length (SD3)
  tensor "pooled"            [N, V]      FLUX (V 768) and SD3 (V 2048)
  tensor "negative_context"  [M, L, D]   only when a negative prompt is given: the M distinct negative prompts
  tensor "negative_pooled"   [M, V]      FLUX and SD3, with negative_context
  tensor "negative_index"    I64 [N]     row n's negative row in [0, M)
  metadata "prompts" (the N prompts joined with "\\n"), "negative_prompts" (the M negatives, first-seen order,
  joined with "\\n"), "family" ("flux" | "wan" | "sd3"), "encoder" ("t5+clip" | "umt5" | "clip-l+clip-g+t5"),
  "encoder_source", "context_in" (D), "vec_in" (V, FLUX and SD3), "text_len" (L).

--prompts FILE: plain text, one prompt per line (blank lines skipped), or, for a name ending in .jsonl, one JSON
object per line with "prompt" and an optional "negative_prompt". --negative-prompt TEXT is the negative of every
prompt whose row has none ("default": the model's own default negative prompt: Wan2.1's sample_neg_prompt; for
SD3 the empty prompt "", which StableDiffusion3Pipeline encodes like any prompt when it guides: its negative
features are those of "", not zeros; FLUX.1 has none). When some prompts have a negative and others not, those
others get the empty prompt "" as their negative.

Datasets at scale: --shard-rows R makes --out a directory of shards prompts-00001-of-0000K.safetensors of R
prompts each (the last may hold fewer), every shard a file of the layout above with the negatives its rows use;
the prompts are encoded and written shard by shard, so memory holds one shard. branchgrpo reads such a
directory by row through memory-mapped files (data.embeddings = "DIR"). --test-count N moves a seeded random
sample of N prompts (--split-seed, default 0; in their file order) to --test-out, written the same way: the
held-out prompts of an evaluation, never trained on.

Usage:
  pip install torch transformers safetensors sentencepiece ftfy
  python3 scripts/export_prompt_embeddings.py --model flux --prompts prompts.txt --out prompts.safetensors \\
      [--repo black-forest-labs/FLUX.1-dev] [--max-length 512] [--device cuda] [--batch 8]
  python3 scripts/export_prompt_embeddings.py --model wan --prompts prompts.jsonl --out prompts.safetensors \\
      --negative-prompt default [--repo Wan-AI/Wan2.1-T2V-1.3B-Diffusers]
  python3 scripts/export_prompt_embeddings.py --model sd3 --prompts prompts.txt --out prompts.safetensors \\
      --negative-prompt default [--repo stabilityai/stable-diffusion-3.5-medium] [--max-length 256]
  python3 scripts/export_prompt_embeddings.py --model flux --prompts prompts.jsonl --out train/ \
      --shard-rows 1000 --test-count 500 --test-out test/
"""
import argparse
import glob
import html
import importlib.util
import json
import os
import random
import re
import sys

# Wan2.1's text_len (its shared config): the transformer zero-pads the text to this many tokens.
WAN_TEXT_LEN = 512
# Wan2.1's default negative prompt: `sample_neg_prompt` of its shared config (wan/configs/shared_config.py).
WAN_DEFAULT_NEGATIVE = ("色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，"
                        "整体发灰，最差质量，低质量，"
                        "JPEG压缩残留，丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，"
                        "形态畸形的肢体，手指融合，静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走")
# SD3's default negative prompt: StableDiffusion3Pipeline.encode_prompt encodes `negative_prompt or ""`.
SD3_DEFAULT_NEGATIVE = ""
# SD3's max_sequence_length default: the T5 tokens after the 77 CLIP tokens.
SD3_MAX_LENGTH = 256
DEFAULT_REPO = {"flux": "black-forest-labs/FLUX.1-dev", "wan": "Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
                "sd3": "stabilityai/stable-diffusion-3.5-medium"}
# The components each family loads, named as the subfolders of its diffusers repository.
COMPONENTS = {"flux": ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2"),
              "wan": ("text_encoder", "tokenizer"),
              "sd3": ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "text_encoder_3", "tokenizer_3")}
ENCODER = {"flux": "t5+clip", "wan": "umt5", "sd3": "clip-l+clip-g+t5"}
DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}


def fail(message):
    sys.exit("error: " + message)


def check_line_free(text, where, what):
    if "\n" in text or "\r" in text:
        fail("%s: the %s holds a newline" % (where, what))


def parse_jsonl_row(line, where):
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        fail("%s: not JSON (%s)" % (where, e.msg))
    if not isinstance(row, dict):
        fail("%s: not a JSON object" % where)
    if "prompt" not in row:
        fail('%s: no "prompt"' % where)
    prompt, negative = row["prompt"], row.get("negative_prompt")
    if not isinstance(prompt, str):
        fail('%s: "prompt" is not a string' % where)
    if not prompt.strip():
        fail('%s: "prompt" is empty' % where)
    if negative is not None and not isinstance(negative, str):
        fail('%s: "negative_prompt" is not a string' % where)
    return prompt, negative


def read_prompts(path):
    """The prompts of FILE and each one's own negative prompt (None where its row has none)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        fail("%s: %s" % (path, e.strerror))
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    jsonl = path.endswith(".jsonl")
    prompts, negatives = [], []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        where = "%s:%d" % (path, number)
        try:
            line = raw.removesuffix(b"\r").decode("utf-8")
        except UnicodeDecodeError:
            fail("%s: not UTF-8" % where)
        if not line.strip():
            continue
        prompt, negative = parse_jsonl_row(line, where) if jsonl else (line, None)
        check_line_free(prompt, where, "prompt")
        if negative is not None:
            check_line_free(negative, where, "negative prompt")
        prompts.append(prompt)
        negatives.append(negative)
    if not prompts:
        fail("%s: holds no prompts" % path)
    return prompts, negatives


def resolve_negatives(own, flag):
    """(distinct negatives in first-seen order, row n's index into them), or None when no prompt has one."""
    negatives = [flag if n is None else n for n in own]
    if all(n is None for n in negatives):
        return None
    negatives = ["" if n is None else n for n in negatives]
    distinct = list(dict.fromkeys(negatives))
    row_of = {text: row for row, text in enumerate(distinct)}
    return distinct, [row_of[n] for n in negatives]


def component_sources(args):
    """{component: (source, subfolder)}: a flag's folder or repository id as it is, else --repo's subfolder."""
    repo = args.repo or DEFAULT_REPO[args.model]
    sources = {}
    for name in COMPONENTS[args.model]:
        given = getattr(args, name)
        sources[name] = (given, "") if given else (repo, name)
    return sources


def describe_sources(sources):
    return ", ".join("%s=%s" % (name, source + "/" + sub if sub else source)
                     for name, (source, sub) in sources.items())


def load(cls, source, subfolder, **kwargs):
    if subfolder:
        kwargs["subfolder"] = subfolder
    return cls.from_pretrained(source, **kwargs)


def flux_encoder(sources, dtype, device, max_length):
    from transformers import CLIPTextModel, CLIPTokenizer, T5EncoderModel, T5TokenizerFast

    clip_tokenizer = load(CLIPTokenizer, *sources["tokenizer"])
    clip = load(CLIPTextModel, *sources["text_encoder"], torch_dtype=dtype).to(device).eval()
    t5_tokenizer = load(T5TokenizerFast, *sources["tokenizer_2"])
    t5 = load(T5EncoderModel, *sources["text_encoder_2"], torch_dtype=dtype).to(device).eval()

    def encode(texts):
        ids = t5_tokenizer(texts, padding="max_length", max_length=max_length, truncation=True,
                           return_tensors="pt").input_ids
        context = t5(input_ids=ids.to(device)).last_hidden_state
        ids = clip_tokenizer(texts, padding="max_length", max_length=clip_tokenizer.model_max_length,
                             truncation=True, return_tensors="pt").input_ids
        return context, clip(input_ids=ids.to(device)).pooler_output

    return encode


def wan_clean(text, fix_text):
    if fix_text is not None:
        text = fix_text(text)
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


def wan_encoder(sources, dtype, device):
    import torch
    from transformers import AutoTokenizer, UMT5EncoderModel

    try:
        from ftfy import fix_text
    except ImportError:
        fix_text = None
        print("note: ftfy is not installed, so prompts are not passed through ftfy.fix_text as Wan2.1 does "
              "(pip install ftfy)", file=sys.stderr)
    tokenizer = load(AutoTokenizer, *sources["tokenizer"])
    umt5 = load(UMT5EncoderModel, *sources["text_encoder"], torch_dtype=dtype).to(device).eval()

    def encode(texts):
        tokens = tokenizer([wan_clean(t, fix_text) for t in texts], padding="max_length", max_length=WAN_TEXT_LEN,
                           truncation=True, add_special_tokens=True, return_attention_mask=True,
                           return_tensors="pt")
        mask = tokens.attention_mask.to(device)
        hidden = umt5(input_ids=tokens.input_ids.to(device), attention_mask=mask).last_hidden_state
        context = torch.zeros_like(hidden)
        for row, length in enumerate(mask.gt(0).sum(dim=1).tolist()):
            context[row, :length] = hidden[row, :length]
        return context, None

    return encode


def sd3_encoder(sources, dtype, device, max_length):
    import torch
    from transformers import CLIPTextModelWithProjection, CLIPTokenizer, T5EncoderModel, T5TokenizerFast

    clip_l_tokenizer = load(CLIPTokenizer, *sources["tokenizer"])
    clip_l = load(CLIPTextModelWithProjection, *sources["text_encoder"], torch_dtype=dtype).to(device).eval()
    clip_g_tokenizer = load(CLIPTokenizer, *sources["tokenizer_2"])
    clip_g = load(CLIPTextModelWithProjection, *sources["text_encoder_2"], torch_dtype=dtype).to(device).eval()
    t5_tokenizer = load(T5TokenizerFast, *sources["tokenizer_3"])
    t5 = load(T5EncoderModel, *sources["text_encoder_3"], torch_dtype=dtype).to(device).eval()
    clip_width = clip_l.config.hidden_size + clip_g.config.hidden_size
    if clip_width > t5.config.d_model:
        t5_source = describe_sources({"text_encoder_3": sources["text_encoder_3"]})
        fail(f"SD3 pads CLIP-L + CLIP-G's {clip_width} features to T5's width, but T5 ({t5_source}) is "
             f"{t5.config.d_model} wide")
    # The pipeline's tokenizer_max_length: CLIP-L's tokenizer's, used for both CLIP tokenizers (77).
    clip_length = clip_l_tokenizer.model_max_length

    def clip(tokenizer, model, texts):
        ids = tokenizer(texts, padding="max_length", max_length=clip_length, truncation=True,
                        return_tensors="pt").input_ids
        out = model(ids.to(device), output_hidden_states=True)
        return out.hidden_states[-2], out.text_embeds

    def encode(texts):
        l_tokens, l_pooled = clip(clip_l_tokenizer, clip_l, texts)
        g_tokens, g_pooled = clip(clip_g_tokenizer, clip_g, texts)
        ids = t5_tokenizer(texts, padding="max_length", max_length=max_length, truncation=True,
                           add_special_tokens=True, return_tensors="pt").input_ids
        t5_tokens = t5(input_ids=ids.to(device)).last_hidden_state
        clip_tokens = torch.cat([l_tokens, g_tokens], dim=-1)
        clip_tokens = torch.nn.functional.pad(clip_tokens, (0, t5_tokens.shape[-1] - clip_tokens.shape[-1]))
        return torch.cat([clip_tokens, t5_tokens], dim=-2), torch.cat([l_pooled, g_pooled], dim=-1)

    return encode


def encode_all(encode, texts, batch, out_dtype):
    import torch

    contexts, pooled = [], []
    with torch.no_grad():
        for start in range(0, len(texts), batch):
            context, vec = encode(texts[start:start + batch])
            contexts.append(context.to(out_dtype).cpu())
            if vec is not None:
                pooled.append(vec.to(out_dtype).cpu())
    return torch.cat(contexts).contiguous(), torch.cat(pooled).contiguous() if pooled else None


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, choices=("flux", "wan", "sd3"), help="whose text encoders")
    parser.add_argument("--prompts", required=True, help="text file (one prompt per line) or .jsonl file")
    parser.add_argument("--out", required=True, help="output .safetensors file (a directory with --shard-rows)")
    parser.add_argument("--negative-prompt", help='the negative of every prompt without its own ("default": '
                                                  "Wan2.1's default negative prompt; SD3's, the empty prompt)")
    defaults = ", ".join("%s for %s" % (repo, model) for model, repo in DEFAULT_REPO.items())
    parser.add_argument("--repo", help="the diffusers repository id or local folder with the encoder subfolders "
                                       "(default: %s)" % defaults)
    parser.add_argument("--text-encoder", help="folder or repository id of the text encoder (FLUX: CLIP, Wan: umT5, "
                                               "SD3: CLIP-L)")
    parser.add_argument("--tokenizer", help="folder or repository id of its tokenizer")
    parser.add_argument("--text-encoder-2", help="FLUX: folder or repository id of the T5 encoder; SD3: of CLIP-G")
    parser.add_argument("--tokenizer-2", help="FLUX: folder or repository id of the T5 tokenizer; SD3: CLIP-G's")
    parser.add_argument("--text-encoder-3", help="SD3: folder or repository id of the T5 encoder")
    parser.add_argument("--tokenizer-3", help="SD3: folder or repository id of the T5 tokenizer")
    parser.add_argument("--max-length", type=int, help="FLUX: T5 tokens (default 512 for dev, 256 for schnell); "
                                                      "SD3: T5 tokens after the 77 CLIP tokens (max_sequence_length, "
                                                      "default 256); Wan: always its text_len, 512")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="encoder compute dtype")
    parser.add_argument("--out-dtype", choices=("f32", "bf16"), default="f32", help="stored dtype")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=8, help="prompts encoded at once")
    parser.add_argument("--shard-rows", type=int, help="write --out (and --test-out) as a directory of shards of "
                                                       "this many prompts")
    parser.add_argument("--test-count", type=int, default=0, help="prompts moved to --test-out (a seeded sample)")
    parser.add_argument("--test-out", help="the held-out prompts' file (a directory with --shard-rows)")
    parser.add_argument("--split-seed", type=int, default=0, help="the seed of the --test-count sample")
    args = parser.parse_args(argv)
    if args.batch < 1:
        fail("--batch must be at least 1")
    if args.shard_rows is not None and args.shard_rows < 1:
        fail("--shard-rows = %d: must be at least 1" % args.shard_rows)
    if args.test_count < 0:
        fail("--test-count = %d: must be at least 0" % args.test_count)
    if (args.test_count > 0) != (args.test_out is not None):
        fail("--test-count and --test-out go together")
    if args.model == "wan":
        if args.max_length not in (None, WAN_TEXT_LEN):
            fail("--max-length is Wan2.1's text_len, %d" % WAN_TEXT_LEN)
        if args.text_encoder_2 or args.tokenizer_2:
            fail("--text-encoder-2 and --tokenizer-2 are FLUX's T5 and SD3's CLIP-G; Wan has one text encoder")
        args.max_length = WAN_TEXT_LEN
    else:
        if args.max_length is None:
            args.max_length = 512 if args.model == "flux" else SD3_MAX_LENGTH
        if args.max_length < 1:
            fail("--max-length must be at least 1")
        if args.model == "flux" and args.negative_prompt == "default":
            fail("--negative-prompt default is Wan2.1's default negative prompt; FLUX.1 has none")
    if args.model != "sd3" and (args.text_encoder_3 or args.tokenizer_3):
        fail(f"--text-encoder-3 and --tokenizer-3 are SD3's T5; {args.model} has no third text encoder")
    if args.negative_prompt == "default":
        args.negative_prompt = WAN_DEFAULT_NEGATIVE if args.model == "wan" else SD3_DEFAULT_NEGATIVE
    if args.negative_prompt is not None:
        check_line_free(args.negative_prompt, "--negative-prompt", "negative prompt")
    for flag, path in (("--out", args.out), ("--test-out", args.test_out)):
        if path is None:
            continue
        if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            fail("%s: its folder does not exist" % path)
        if args.shard_rows is not None and os.path.isdir(path) and glob.glob(os.path.join(path, "*.safetensors")):
            fail("%s: %s already holds .safetensors files (a shard directory holds one dataset's shards)"
                 % (path, flag))
        if args.shard_rows is None and os.path.isdir(path):
            fail("%s: %s is a directory (give --shard-rows to write shards there)" % (path, flag))
    return args


def main(argv=None):
    args = parse_args(argv)
    prompts, own_negatives = read_prompts(args.prompts)
    negatives = resolve_negatives(own_negatives, args.negative_prompt)

    missing = [name for name in ("torch", "transformers", "safetensors") if importlib.util.find_spec(name) is None]
    if missing:
        fail("%s lacks %s (pip install torch transformers safetensors sentencepiece ftfy)"
             % (sys.executable, ", ".join(missing)))
    import torch

    dtype = getattr(torch, DTYPES[args.dtype])
    out_dtype = torch.float32 if args.out_dtype == "f32" else torch.bfloat16
    sources = component_sources(args)
    if args.model == "flux":
        encode = flux_encoder(sources, dtype, args.device, args.max_length)
    elif args.model == "sd3":
        encode = sd3_encoder(sources, dtype, args.device, args.max_length)
    else:
        encode = wan_encoder(sources, dtype, args.device)

    # The split: a seeded sample of --test-count rows to --test-out, both parts in file order.
    if args.test_count >= len(prompts):
        fail("--test-count = %d: %s holds %d prompts, and training needs at least one"
             % (args.test_count, args.prompts, len(prompts)))
    test_rows = set(random.Random(args.split_seed).sample(range(len(prompts)), args.test_count))
    parts = [(args.out, [r for r in range(len(prompts)) if r not in test_rows])]
    if args.test_out is not None:
        parts.append((args.test_out, sorted(test_rows)))
    common = {"family": args.model, "encoder": ENCODER[args.model], "encoder_source": describe_sources(sources)}
    negative_features = None
    if negatives is not None:  # every distinct negative encoded once; each file keeps those its rows use
        negative_features = encode_all(encode, negatives[0], args.batch, out_dtype)
    for out, rows in parts:
        if args.shard_rows is None:
            write_prompt_file(out, rows, prompts, negatives, negative_features, encode, args, out_dtype, common)
            continue
        os.makedirs(out, exist_ok=True)
        count = (len(rows) + args.shard_rows - 1) // args.shard_rows
        width = max(5, len(str(count)))
        for k in range(count):
            name = "prompts-%0*d-of-%0*d.safetensors" % (width, k + 1, width, count)
            write_prompt_file(os.path.join(out, name), rows[k * args.shard_rows:(k + 1) * args.shard_rows], prompts,
                              negatives, negative_features, encode, args, out_dtype, common)


def write_prompt_file(path, rows, prompts, negatives, negative_features, encode, args, out_dtype, common):
    """Encodes prompts[rows] and writes them, with the negatives they use, as one file of the layout (atomic)."""
    import torch
    from safetensors.torch import save_file

    texts = [prompts[r] for r in rows]
    context, pooled = encode_all(encode, texts, args.batch, out_dtype)
    tensors = {"context": context}
    metadata = dict(common, prompts="\n".join(texts), context_in=str(context.shape[2]),
                    text_len=str(context.shape[1]))
    if pooled is not None:
        tensors["pooled"] = pooled
        metadata["vec_in"] = str(pooled.shape[1])
    if negatives is not None:
        distinct, index = negatives
        used = list(dict.fromkeys(index[r] for r in rows))  # first-seen order
        local = {row: k for k, row in enumerate(used)}
        negative_context, negative_pooled = negative_features
        tensors["negative_context"] = negative_context[used].contiguous()
        if negative_pooled is not None:
            tensors["negative_pooled"] = negative_pooled[used].contiguous()
        tensors["negative_index"] = torch.tensor([local[index[r]] for r in rows], dtype=torch.int64)
        metadata["negative_prompts"] = "\n".join(distinct[k] for k in used)
    temporary = path + ".tmp"
    save_file(tensors, temporary, metadata=metadata)
    os.replace(temporary, path)
    print("wrote %s: %s" % (path, ", ".join("%s %s" % (name, list(t.shape)) for name, t in tensors.items())))


if __name__ == "__main__":
    main()
