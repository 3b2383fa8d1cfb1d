#!/usr/bin/env bash
# Runs train_gpt on N data-parallel ranks on this machine with mpirun, adding what Open MPI needs here:
# --allow-run-as-root when run as root, --oversubscribe when N exceeds this machine's cores, and
# --bind-to none; each rank gets one CPU thread (--threads 1) unless the flags say otherwise.
# Everything after -n N goes to train_gpt. Installs what is missing and builds train_gpt first, like
# scripts/train.sh, and without --data trains on Tiny Shakespeare (downloaded when missing).
#   scripts/launch.sh -n N [train_gpt flags...]
#   e.g. scripts/launch.sh -n 4 --zero-stage 2 --dtype fp16 --steps 50
# ZERO_MPIRUN_ARGS adds mpirun options (e.g. "--hostfile hosts"). On a cluster call mpirun directly:
#   mpirun -np 16 --hostfile hosts build/bin/train_gpt --data data/tinyshakespeare.txt --zero-stage 2
set -euo pipefail
source "$(dirname "$0")/common.sh"
usage="usage: scripts/launch.sh -n N [train_gpt flags...]"
n=""
case "${1:-}" in
  -n|-np|--np) [ $# -ge 2 ] || { echo "error: $1 needs a number; $usage" >&2; exit 2; }; n="$2"; shift 2 ;;
  -n*) n="${1#-n}"; shift ;;
  -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
  *) echo "error: the first argument must be -n N (ranks); $usage" >&2; exit 2 ;;
esac
[[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "error: -n '$n' is not a positive number of ranks; $usage" >&2; exit 2; }
has_data=0 has_threads=0
for arg in "$@"; do
  case "$arg" in
    --data|--data=*) has_data=1 ;;
    --threads|--threads=*) has_threads=1 ;;
  esac
done
extra=()
[ $has_data = 0 ] && [ ! -f "$ZERO_CORPUS" ] && ! zero_has_downloader && extra=(curl ca-certificates)
"$ZERO_ROOT/scripts/setup.sh" "${extra[@]}"
flags=()
if [ $has_data = 0 ]; then
  zero_fetch_corpus "scripts/launch.sh -n $n --data path/to.txt ..."
  flags+=(--data "$ZERO_CORPUS")
fi
[ $has_threads = 0 ] && flags+=(--threads 1)
zero_build_train_gpt

mpirun_args=(-np "$n" --bind-to none)
[ "$(id -u)" = 0 ] && mpirun_args+=(--allow-run-as-root)
[ "$n" -gt "$(nproc)" ] && mpirun_args+=(--oversubscribe)
# shellcheck disable=SC2206  # word splitting of the user's extra options is intended
[ -n "${ZERO_MPIRUN_ARGS:-}" ] && mpirun_args+=($ZERO_MPIRUN_ARGS)
echo "launch: mpirun ${mpirun_args[*]} $ZERO_BUILD/bin/train_gpt ${flags[*]} $*"
exec mpirun "${mpirun_args[@]}" "$ZERO_BUILD/bin/train_gpt" "${flags[@]}" "$@"
