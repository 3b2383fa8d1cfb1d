#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh), builds train_gpt, sample_gpt and zero_explain (Release,
# build/) and trains the example GPT on a text file. Works from any directory; relative paths are the
# caller's. ZERO_MAX_STEPS=N caps the steps (train_gpt honours it; for quick runs of the documented
# commands).
#   scripts/train.sh [PATH_TO_TEXT] [more train_gpt flags...]
# With no path it trains on data/tinyshakespeare.txt in the repository, downloading it first when it
# is not there (curl, wget or python3; SHA-256 checked). ZERO_CORPUS_URL overrides the download URL.
set -euo pipefail
source "$(dirname "$0")/common.sh"
data=""
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then  # a first argument that is not a flag is the text's path
  data="$1"
  shift
  [ -f "$data" ] || { echo "error: '$data' is not a file (scripts/train.sh [PATH_TO_TEXT] [train_gpt flags])" >&2; exit 1; }
fi
extra=()
[ -z "$data" ] && [ ! -f "$ZERO_CORPUS" ] && ! zero_has_downloader && extra=(curl ca-certificates)
"$ZERO_ROOT/scripts/setup.sh" "${extra[@]}"
if [ -z "$data" ]; then
  zero_fetch_corpus "scripts/train.sh path/to.txt"
  data="$ZERO_CORPUS"
fi
zero_build
exec "$ZERO_BUILD/bin/train_gpt" --data "$data" "$@"
