#!/bin/sh
# cli_export_lora_keys: exports the fixture checkpoints of test_lora_export in every format, then checks the
# written keys and shapes against diffusers' module list (scripts/check_lora_export.py keys: standard library only).
#   export_lora_all.sh BRANCHGRPO FIXTURE_DIR MODULES_FILE CHECK_SCRIPT
set -eu
tool=$1 dir=$2 modules=$3 check=$4
out=$dir/exported
rm -rf "$out"
mkdir -p "$out"
export_lora() {
  echo "+ branchgrpo export-lora $*"
  "$tool" export-lora "$@"
}
export_lora "$dir/flux/iter-000002" --format diffusers --output "$out/flux_diffusers.safetensors"
export_lora "$dir/flux/iter-000002" --format kohya --output "$out/flux_kohya.safetensors"
export_lora "$dir/flux/iter-000002" --format comfyui --output "$out/flux_comfyui.safetensors"
export_lora "$dir/flux/iter-000002" --format diffusers --ema --dtype bf16 --output "$out/flux_diffusers_ema_bf16.safetensors"
export_lora "$dir/flux/iter-000002" --merge --output "$out/flux_merged.safetensors"
export_lora "$dir/flux_full/iter-000001" --merge --dtype fp16 --output "$out/flux_full_merged.safetensors"
export_lora "$dir/wan/iter-000002" --format diffusers --output "$out/wan_diffusers.safetensors"
export_lora "$dir/wan/iter-000002" --format comfyui --output "$out/wan_comfyui.safetensors"
export_lora "$dir/wan/iter-000002" --merge --output "$out/wan_merged.safetensors"
export_lora "$dir/sd3/iter-000002" --format diffusers --output "$out/sd3_diffusers.safetensors"
export_lora "$dir/sd3/iter-000002" --format kohya --output "$out/sd3_kohya.safetensors"
export_lora "$dir/sd3/iter-000002" --format comfyui --output "$out/sd3_comfyui.safetensors"
export_lora "$dir/sd3/iter-000002" --merge --output "$out/sd3_merged.safetensors"
# Wan2.2: a file per expert, e.g. wan22_diffusers.high_noise_model.safetensors and .low_noise_model.safetensors
export_lora "$dir/wan22/iter-000002" --format diffusers --output "$out/wan22_diffusers.safetensors"
export_lora "$dir/wan22/iter-000002" --format comfyui --output "$out/wan22_comfyui.safetensors"
export_lora "$dir/wan22/iter-000002" --merge --output "$out/wan22_merged.safetensors"
exec python3 "$check" keys --modules "$modules" "$dir"
