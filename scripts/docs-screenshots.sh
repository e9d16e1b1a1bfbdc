#!/usr/bin/env bash
# Screenshots of the built site (make docs first) with headless Chromium, to see how the pages
# read: Home, Configuration Reference, CLI Reference.  scripts/docs-screenshots.sh [OUT_DIR]
# Needs chromium (Debian: apt-get install chromium).
set -euo pipefail
OUT=${1:-site-screenshots}
PORT=${DOCS_PORT:-8123}
[ -f site/index.html ] || { echo "no site/: run make docs first" >&2; exit 2; }
command -v chromium >/dev/null || { echo "no chromium: apt-get install chromium" >&2; exit 2; }
mkdir -p "$OUT"
python3 -m http.server "$PORT" --bind 127.0.0.1 --directory site >/dev/null 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
sleep 1
for page in "" reference/configuration/ reference/cli/; do
  name=${page%/}; name=${name//\//_}; name=${name:-home}
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,2600 \
    --screenshot="$OUT/$name.png" "http://127.0.0.1:$PORT/$page" 2>/dev/null
  echo "$OUT/$name.png"
done
