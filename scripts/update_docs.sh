#!/usr/bin/env bash
# Rewrites the generated blocks of the docs from the tool's output (the ctest cli_policies_docs checks them):
#   docs/config.md  <!-- policies:begin ... --> ... <!-- policies:end -->  =  branchgrpo policies --markdown
# Usage: scripts/update_docs.sh [path/to/branchgrpo]   (default build/bin/branchgrpo)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tool=${1:-build/bin/branchgrpo}
generated=$(mktemp)
trap 'rm -f "$generated"' EXIT
"$tool" policies --markdown >"$generated"
python3 - docs/config.md policies "$generated" <<'PY'
import sys
path, name, generated = sys.argv[1], sys.argv[2], open(sys.argv[3]).read()
text = open(path).read()
begin = text.index(f"<!-- {name}:begin")
first = text.index("\n", begin) + 1
end = text.index(f"<!-- {name}:end -->")
open(path, "w").write(text[:first] + generated + text[end:])
PY
echo "update_docs.sh: docs/config.md policies block rewritten"
