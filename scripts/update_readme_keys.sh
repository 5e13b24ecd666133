#!/usr/bin/env bash
# Rewrites README.md's config key table (between the keys:begin and keys:end markers) from
# `moetrain keys`, the listing of the one key table in src/moe/train/config_keys.h. The test
# Config.ReadmeKeyTableIsTheListingTheBinaryPrints fails until this has been run after a key change.
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${1:-build/moetrain}
table=$("$binary" keys)
python3 - "$table" <<'PY'
import sys, re
table = sys.argv[1]
text = open("README.md").read()
new, n = re.subn(r"(<!-- keys:begin -->\n).*?(<!-- keys:end -->)", lambda m: m.group(1) + table + "\n" + m.group(2),
                 text, flags=re.S)
if n != 1:
    sys.exit("README.md has no <!-- keys:begin --> ... <!-- keys:end --> block")
open("README.md", "w").write(new)
PY
