#!/usr/bin/env bash
# Runs python/tests/test_flow_factory.py (the branchgrpo trainer in Flow-Factory's own loop, docs/flow_factory.md)
# against a Flow-Factory checkout, in a venv of its own that sees the project's venv:
#
#   scripts/flow_factory_env.sh CHECKOUT [pytest arguments]
#
# CHECKOUT is a clone of github X-GenGroup/Flow-Factory (tested at a0b2bc5a2b4fbf9125429b3fb70c0c5d7631047c); it is
# used from its src/ (put on sys.path by the test), not installed. The venv ($FLOW_FACTORY_VENV, default
# /tmp/ffvenv) is made by the project venv's python, with a .pth file that puts the project venv's site-packages
# (torch, diffusers, transformers, accelerate, peft, the branchgrpo package) on its path, and the pinned packages
# below that Flow-Factory imports and the project's venv does not have (--no-deps: everything else comes from the
# project's venv, which is left as it is). Idempotent: a rerun only runs the test.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ $# -lt 1 ]]; then
  echo "usage: scripts/flow_factory_env.sh CHECKOUT [pytest arguments] (CHECKOUT: a Flow-Factory clone)" >&2
  exit 2
fi
checkout=$(cd "$1" 2>/dev/null && pwd) || { echo "flow_factory_env.sh: CHECKOUT = $1: no such directory" >&2; exit 2; }
shift
if [[ ! -f "$checkout/src/flow_factory/__init__.py" ]]; then
  echo "flow_factory_env.sh: CHECKOUT = $checkout: no src/flow_factory there (a Flow-Factory clone)" >&2
  exit 2
fi
project_python=$PWD/.venv/bin/python
if [[ ! -x $project_python ]]; then
  echo "flow_factory_env.sh: no .venv: run ./scripts/setup.sh and ./scripts/python_package.sh first" >&2
  exit 2
fi
if ! "$project_python" -c 'import branchgrpo.flow_factory' 2>/dev/null; then
  echo "flow_factory_env.sh: the installed branchgrpo has no flow_factory module: run ./scripts/python_package.sh" >&2
  exit 2
fi

# Flow-Factory's imports that the project's venv lacks, with what they need. torchvision 0.29.2 is the newest on
# PyPI (built for torch 2.14; its operators load with the project's torch 2.15.0); Flow-Factory does not import it,
# transformers' image processors prefer it.
pins=(
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 pyarrow==26.0.1 pandas==3.1.1 python-dateutil==4.0.0
  tzdata==2026.6 xxhash==4.1.0 imageio==2.38.2 einops==0.8.2 sentencepiece==0.2.3 torchvision==0.29.2
)
venv=${FLOW_FACTORY_VENV:-/tmp/ffvenv}
if [[ ! -x $venv/bin/python ]]; then
  echo "flow_factory_env.sh: making $venv"
  "$project_python" -m venv "$venv"
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
project_site=$("$project_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$project_site" >"$site/branchgrpo-project-venv.pth"
installed=$("$venv/bin/python" -m pip freeze --path "$site" 2>/dev/null || true)
missing=()
for pin in "${pins[@]}"; do
  grep -qixF "$pin" <<<"$installed" || missing+=("$pin")
done
if ((${#missing[@]} > 0)); then
  echo "flow_factory_env.sh: installing ${missing[*]} into $venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "${missing[@]}"
fi

commit=$(git -C "$checkout" rev-parse HEAD 2>/dev/null || echo "unknown (not a git checkout)")
echo "flow_factory_env.sh: Flow-Factory $checkout at $commit; python $venv/bin/python"
BRANCHGRPO_FLOW_FACTORY=$checkout exec "$venv/bin/python" -m pytest -p no:cacheprovider -q \
  python/tests/test_flow_factory.py "$@"
