# Shared by scripts/train.sh and scripts/launch.sh (sourced, not run): the repository root, the
# Release build of train_gpt, and the Tiny Shakespeare corpus.

ZERO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ZERO_BUILD="$ZERO_ROOT/build"
ZERO_CORPUS="$ZERO_ROOT/data/tinyshakespeare.txt"
# karpathy/char-rnn's copy of Tiny Shakespeare (1,115,394 bytes). ZERO_CORPUS_URL points the download
# elsewhere (a mirror, or a file:// URL); the checksum is checked all the same.
ZERO_CORPUS_URL="${ZERO_CORPUS_URL:-https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt}"
ZERO_CORPUS_SHA256=86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed

# zero_build_train_gpt: configure build/ (Release) if needed and bring train_gpt up to date, quietly;
# on failure shows the tail of the log.
zero_build_train_gpt() {
  local log="$ZERO_BUILD/train_gpt.build.log" launcher=()
  mkdir -p "$ZERO_BUILD"
  if [ ! -f "$ZERO_BUILD/CMakeCache.txt" ] && command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  echo "build: train_gpt (Release) in $ZERO_BUILD"
  if ! { cmake -S "$ZERO_ROOT" -B "$ZERO_BUILD" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" &&
         cmake --build "$ZERO_BUILD" -j"$(nproc)" --target train_gpt; } >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "build: failed (full log: $log)" >&2
    return 1
  fi
}

# zero_has_downloader: curl, wget or python3 is on PATH.
zero_has_downloader() { command -v curl >/dev/null || command -v wget >/dev/null || command -v python3 >/dev/null; }

# zero_fetch_corpus HINT: downloads Tiny Shakespeare into data/ unless it is there, checks its SHA-256,
# and on any failure prints one line (what failed, and HINT: the command that trains on another text
# file instead) and returns 1, leaving nothing behind.
zero_fetch_corpus() {
  [ -f "$ZERO_CORPUS" ] && return 0
  local hint="$1" part="$ZERO_CORPUS.part" ok=1 sum
  mkdir -p "$(dirname "$ZERO_CORPUS")"
  if command -v curl >/dev/null; then
    curl -fsSL --retry 2 --connect-timeout 15 -o "$part" "$ZERO_CORPUS_URL" 2>/dev/null || ok=0
  elif command -v wget >/dev/null && [ "${ZERO_CORPUS_URL#file://}" = "$ZERO_CORPUS_URL" ]; then
    wget -q --timeout=15 --tries=2 -O "$part" "$ZERO_CORPUS_URL" 2>/dev/null || ok=0
  elif command -v python3 >/dev/null; then
    python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
      "$ZERO_CORPUS_URL" "$part" 2>/dev/null || ok=0
  else
    ok=0
  fi
  if [ $ok = 0 ] || [ ! -s "$part" ]; then
    rm -f "$part"
    echo "error: could not download Tiny Shakespeare from $ZERO_CORPUS_URL; to train on any other text file instead: $hint" >&2
    return 1
  fi
  sum=$(sha256sum "$part" | cut -d' ' -f1)
  if [ "$sum" != "$ZERO_CORPUS_SHA256" ]; then
    rm -f "$part"
    echo "error: the file downloaded from $ZERO_CORPUS_URL has SHA-256 $sum, not Tiny Shakespeare's $ZERO_CORPUS_SHA256; nothing kept (to train on another text file: $hint)" >&2
    return 1
  fi
  mv "$part" "$ZERO_CORPUS"
  echo "data: downloaded Tiny Shakespeare to $ZERO_CORPUS (SHA-256 verified)"
}
