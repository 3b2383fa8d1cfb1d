#!/usr/bin/env bash
# Sets up, builds (Release) and trains the example GPT on a text file.
#   scripts/train.sh [PATH_TO_TEXT] [more train_gpt flags...]
# With no path it uses data/tinyshakespeare.txt and, if that is missing, says how to download it.
set -euo pipefail
cd "$(dirname "$0")/.."
data=data/tinyshakespeare.txt
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then  # a first argument that is not a flag is the text's path
  data="$1"
  shift
fi
if [ ! -f "$data" ]; then
  echo "error: $data not found. Get Tiny Shakespeare with:" >&2
  echo "  mkdir -p data && curl -o data/tinyshakespeare.txt https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt" >&2
  exit 1
fi
scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target train_gpt
exec build/bin/train_gpt --data "$data" "$@"
