# Shared by scripts/train.sh and scripts/launch.sh (sourced, not run): the repository root, the
# Release build of the example programs, and the Tiny Shakespeare corpus.

ZERO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ZERO_BUILD="$ZERO_ROOT/build"
ZERO_CORPUS="$ZERO_ROOT/data/tinyshakespeare.txt"
# karpathy/char-rnn's copy of Tiny Shakespeare (1,115,394 bytes). ZERO_CORPUS_URL points the download
# elsewhere (a mirror, or a file:// URL); the checksum is checked all the same.
ZERO_CORPUS_URL="${ZERO_CORPUS_URL:-https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt}"
ZERO_CORPUS_SHA256=86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed

# zero_build: brings the programs the README names (train_gpt, sample_gpt, zero_explain) up to date in
# build/ (Release). CMake's configure step runs only for a new build directory (a build re-runs it by
# itself when a CMakeLists.txt changed). Shows progress, a line at every tenth of the way, and keeps the
# whole output in build/build.log; on failure shows its tail.
zero_build() {
  local log="$ZERO_BUILD/build.log" launcher=()
  mkdir -p "$ZERO_BUILD"
  : >"$log"
  if [ ! -f "$ZERO_BUILD/CMakeCache.txt" ]; then
    command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    echo "build: configuring $ZERO_BUILD (Release; the first build takes a few minutes)"
    if ! cmake -S "$ZERO_ROOT" -B "$ZERO_BUILD" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" >>"$log" 2>&1; then
      tail -n 30 "$log" >&2
      echo "build: configuring failed (full log: $log)" >&2
      return 1
    fi
  fi
  echo "build: train_gpt, sample_gpt, zero_explain (Release) in $ZERO_BUILD"
  if ! cmake --build "$ZERO_BUILD" -j"$(nproc)" --target train_gpt sample_gpt zero_explain 2>&1 | tee -a "$log" |
       zero_build_progress; then
    tail -n 30 "$log" >&2
    echo "build: failed (full log: $log)" >&2
    return 1
  fi
}

# zero_build_progress: reads make's output ("[ 42%] Building CXX object .../core/tensor.cpp.o") and
# prints "build:  40% core/tensor.cpp" whenever another tenth of a target's way is done.
zero_build_progress() {
  local line pct what shown=-1
  while IFS= read -r line; do
    [[ $line =~ ^\[\ *([0-9]+)%\]\ (Building|Linking)\ [A-Za-z+]+\ [a-z\ ]*(object|executable|library)\ (.*)$ ]] || continue
    pct=${BASH_REMATCH[1]} what=${BASH_REMATCH[4]}
    what=${what#*.dir/} what=${what%.o}
    [ "${BASH_REMATCH[2]}" = Linking ] && what="linking ${what##*/}"
    [ "$pct" -lt "$shown" ] && shown=-1  # make starts again at 0 for the next target
    if [ $((pct / 10)) -gt $((shown / 10)) ] || [ "$shown" -lt 0 ]; then
      printf 'build: %3d%% %s\n' "$pct" "$what"
      shown=$pct
    fi
  done
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
