#!/usr/bin/env python3
"""Encode prompts with FLUX.1's text encoders and write a branchgrpo prompt-embeddings file.

branchgrpo does not run T5 or CLIP itself: it reads per-prompt text features from a safetensors file. This script
makes that file from a list of prompts, for users who have PyTorch, transformers and the FLUX text encoders
(the `text_encoder` / `tokenizer` (CLIP ViT-L/14) and `text_encoder_2` / `tokenizer_2` (T5-v1.1-XXL) folders of
the FLUX.1-dev or FLUX.1-schnell repository, or openai/clip-vit-large-patch14 and google/t5-v1_1-xxl).

Layout written (docs/prompt_embeddings.md):
  tensor "context"  F32 [N, L, 4096]   T5 last_hidden_state, prompts padded / truncated to L = --max-length tokens
  tensor "pooled"   F32 [N, 768]       CLIP pooler_output (77 tokens, padded / truncated)
  metadata "prompts"     the N prompt strings joined with "\\n" (a prompt may not contain a newline)
  metadata "context_in"  "4096" (the width of context), "vec_in": "768" (the width of pooled)

As in FLUX's own pipeline, both tokenizers pad to their maximum length and no attention mask is passed, so the
features are exactly those the transformer was trained with. L is 512 for FLUX.1-dev and 256 for schnell.
The file takes about L * 4096 * 4 bytes per prompt (8 MiB at L = 512).

Usage:
  pip install torch transformers safetensors sentencepiece
  python3 scripts/export_prompt_embeddings.py --prompts prompts.txt --out prompts.safetensors \\
      [--model black-forest-labs/FLUX.1-dev] [--max-length 512] [--device cuda] [--batch 8]
prompts.txt holds one prompt per line (blank lines are skipped).
"""
import argparse
import sys


def read_prompts(path):
    with open(path, encoding="utf-8") as f:
        prompts = [line.rstrip("\r\n") for line in f]
    prompts = [p for p in prompts if p.strip()]
    if not prompts:
        sys.exit("error: %s holds no prompts" % path)
    return prompts


def encode(prompts, model, max_length, device, batch):
    import torch
    from transformers import CLIPTextModel, CLIPTokenizer, T5EncoderModel, T5TokenizerFast

    clip_tokenizer = CLIPTokenizer.from_pretrained(model, subfolder="tokenizer")
    clip = CLIPTextModel.from_pretrained(model, subfolder="text_encoder").to(device).eval()
    t5_tokenizer = T5TokenizerFast.from_pretrained(model, subfolder="tokenizer_2")
    t5 = T5EncoderModel.from_pretrained(model, subfolder="text_encoder_2", torch_dtype=torch.bfloat16)
    t5 = t5.to(device).eval()

    contexts, pooled = [], []
    with torch.no_grad():
        for start in range(0, len(prompts), batch):
            chunk = prompts[start:start + batch]
            ids = t5_tokenizer(chunk, padding="max_length", max_length=max_length, truncation=True,
                               return_tensors="pt").input_ids.to(device)
            contexts.append(t5(input_ids=ids, attention_mask=None).last_hidden_state.float().cpu())
            ids = clip_tokenizer(chunk, padding="max_length", max_length=clip_tokenizer.model_max_length,
                                 truncation=True, return_tensors="pt").input_ids.to(device)
            pooled.append(clip(input_ids=ids, attention_mask=None).pooler_output.float().cpu())
    return torch.cat(contexts).contiguous(), torch.cat(pooled).contiguous()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", required=True, help="text file, one prompt per line")
    parser.add_argument("--out", required=True, help="output .safetensors file")
    parser.add_argument("--model", default="black-forest-labs/FLUX.1-dev",
                        help="a FLUX repository id or local folder with the text encoder subfolders")
    parser.add_argument("--max-length", type=int, default=512, help="T5 tokens (512 dev, 256 schnell)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=8, help="prompts encoded at once")
    args = parser.parse_args()
    if args.max_length < 1 or args.batch < 1:
        sys.exit("error: --max-length and --batch must be at least 1")

    prompts = read_prompts(args.prompts)
    context, pooled = encode(prompts, args.model, args.max_length, args.device, args.batch)

    from safetensors.torch import save_file
    metadata = {
        "prompts": "\n".join(prompts),
        "context_in": str(context.shape[-1]),
        "vec_in": str(pooled.shape[-1]),
    }
    save_file({"context": context, "pooled": pooled}, args.out, metadata=metadata)
    print("wrote %s: %d prompts, context %s, pooled %s" % (args.out, len(prompts), list(context.shape),
                                                           list(pooled.shape)))


if __name__ == "__main__":
    main()
