#!/usr/bin/env bash
# Rewrites the generated blocks of the docs from the tool's output (the ctests cli_policies_docs and
# cli_sections_docs check them):
#   docs/config.md  <!-- policies:begin ... --> ... <!-- policies:end -->  =  branchgrpo policies --markdown
#   docs/config.md  <!-- sections:begin ... --> ... <!-- sections:end -->  =  branchgrpo policies --sections --markdown
# Usage: scripts/update_docs.sh [path/to/branchgrpo]   (default build/bin/branchgrpo)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tool=${1:-build/bin/branchgrpo}
generated=$(mktemp)
trap 'rm -f "$generated"' EXIT
# replace_block NAME: the block NAME of docs/config.md becomes the contents of $generated.
replace_block() {
  python3 - docs/config.md "$1" "$generated" <<'PY'
import sys
path, name, generated = sys.argv[1], sys.argv[2], open(sys.argv[3]).read()
text = open(path).read()
begin = text.index(f"<!-- {name}:begin")
first = text.index("\n", begin) + 1
end = text.index(f"<!-- {name}:end -->")
open(path, "w").write(text[:first] + generated + text[end:])
PY
}
"$tool" policies --markdown >"$generated"
replace_block policies
"$tool" policies --sections --markdown >"$generated"
replace_block sections
echo "update_docs.sh: docs/config.md policies and sections blocks rewritten"
