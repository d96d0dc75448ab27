#!/usr/bin/env bash
# Installs what branchgrpo needs to build and test (Debian 12 packages). A no-op when everything is present.
set -euo pipefail

packages=(cmake g++ catch2 librandom123-dev libcli11-dev nlohmann-json3-dev libeigen3-dev libxtensor-dev
          libbenchmark-dev libopenblas0-pthread python3 python3-venv python3-numpy python3-pil libtorch-dev libgloo-dev python3-torch
          python3-torchvision clang libtomlplusplus-dev libturbojpeg0-dev libpng-dev libgif-dev libcurl4-openssl-dev
          ccache)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg -s "$package" 2>/dev/null | grep -q '^Status: install ok installed'; then
    missing+=("$package")
  fi
done
as_root=()
if [[ $(id -u) -ne 0 ]]; then
  as_root=(sudo)
fi
if ((${#missing[@]} > 0)); then
  echo "setup.sh: installing ${missing[*]}"
  "${as_root[@]}" apt-get update
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi

# The reference checks run on the python3 first on PATH, which need not be Debian's.
if ! python3 -c 'import numpy' 2>/dev/null; then
  echo "setup.sh: installing numpy for $(command -v python3)"
  python3 -m pip install --quiet numpy
fi

# scripts/export_prompt_embeddings.py and its test run on Debian's python3, the one python3-torch (1.13) is
# installed for. transformers 4.46.3 has UMT5 and still supports torch 1.13; it brings tokenizers, safetensors and
# huggingface-hub. ftfy cleans Wan prompts as Wan2.1 does. pip puts them in /usr/local (Debian marks its python3
# as externally managed, hence --break-system-packages; Debian's own packages are left as they are).
if ! /usr/bin/python3 -c 'import ftfy; from transformers import UMT5EncoderModel' 2>/dev/null; then
  echo "setup.sh: installing transformers and ftfy for /usr/bin/python3"
  "${as_root[@]}" /usr/bin/python3 -m pip install --quiet --root-user-action=ignore --break-system-packages \
    'transformers==4.46.3' 'ftfy==6.3.1'
fi

# scripts/export_reward.py's HPS-v2.1 export and its test build open_clip models on Debian's python3 too.
# open-clip-torch 2.24.0 supports torch 1.13; its torchvision is Debian's python3-torchvision 0.14 (above), which
# pip counts as installed, so no PyPI torch is pulled in. timm 0.6.13 and sentencepiece 0.2.0 are its remaining
# requirements, pinned.
if ! /usr/bin/python3 -c 'import open_clip' 2>/dev/null; then
  echo "setup.sh: installing open-clip-torch for /usr/bin/python3"
  "${as_root[@]}" /usr/bin/python3 -m pip install --quiet --root-user-action=ignore --break-system-packages \
    'open-clip-torch==2.24.0' 'timm==0.6.13' 'sentencepiece==0.2.0'
fi

# scripts/track.py (docs/cli.md, "Experiment tracking") and its test run on Debian's python3 as well: tensorboardX
# 2.6.2.2 writes the TensorBoard event files with numpy and Pillow (Debian's 1.24 and 9.4; no PyTorch needed),
# tensorboard 2.15.2 is the viewer and the reader the test checks them with. protobuf is pinned to one that both
# and the optional wandb 0.31 accept (tensorboard 2.15: >= 3.19.6 but not 4.24.0; wandb 0.31: >= 5, < 8). wandb
# itself stays optional (track.py's --wandb-offline names its pip line).
if ! /usr/bin/python3 -c 'import tensorboardX; from tensorboard.backend.event_processing import event_accumulator' \
    2>/dev/null; then
  echo "setup.sh: installing tensorboard and tensorboardX for /usr/bin/python3"
  "${as_root[@]}" /usr/bin/python3 -m pip install --quiet --root-user-action=ignore --break-system-packages \
    'tensorboard==2.15.2' 'tensorboardX==2.6.2.2' 'protobuf==6.33.6'
fi

# The project's venv (.venv) for the Python package (docs/python.md): the build tools and test tools pinned in
# python/requirements.txt, installed when the venv lacks any of them (a no-op otherwise).
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ ! -x "$root/.venv/bin/python" ]]; then
  echo "setup.sh: creating the project's venv (.venv)"
  python3 -m venv "$root/.venv"
fi
if ! "$root/.venv/bin/python" - "$root/python/requirements.txt" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, pinned = line.split("==")
    try:
        if version(name) != pinned:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
then
  echo "setup.sh: installing python/requirements.txt into .venv"
  "$root/.venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$root/python/requirements.txt"
fi
