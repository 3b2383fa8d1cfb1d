#!/usr/bin/env bash
# A save that fails mid-run, on real file systems (a measurement, not a ctest test: it mounts, so it needs
# root): (1) a 2 MiB tmpfs that fills up after some checkpoints, (2) a tmpfs remounted read-only after
# the first checkpoint; each at 1 rank and at 4 ranks (stage 2). Each must end with exit code 1 (< 128),
# exactly one "error:" line naming --save-dir, the reason and the newest checkpoint, within a few
# seconds, and that checkpoint must load (a run resumed from it continues). Prints one line per case.
#   sudo tests/scripts/save_failures_as_root.sh BUILD_DIR
set -uo pipefail
[ "$(id -u)" = 0 ] || { echo "needs root (it mounts tmpfs file systems)" >&2; exit 2; }
build=$(cd "${1:?usage: save_failures_as_root.sh BUILD_DIR}" && pwd)
work=$(mktemp -d)
mnt="$work/mnt"
mkdir -p "$mnt"
trap 'umount "$mnt" 2>/dev/null; rm -rf "$work"' EXIT
for i in $(seq 60); do echo "To be, or not to be, that is the question: whether 'tis nobler $i"; done >"$work/text.txt"
tiny=(--data "$work/text.txt" --n-layer 1 --n-head 2 --n-embd 16 --block 16 --batch 24 --eval-every 0
      --eval-iters 1 --log-every 100000 --sample 0 --threads 1 --zero-stage 2)
mpirun=(mpirun --oversubscribe --bind-to none --allow-run-as-root)
failures=0

run_case() {  # run_case NAME NP SIZE MAKE_UNWRITABLE(0/1)
  local name=$1 np=$2 size=$3 ro=$4 launcher=() pid rc errors newest start
  [ "$np" -gt 1 ] && launcher=("${mpirun[@]}" -np "$np")
  mount -t tmpfs -o size="$size" tmpfs "$mnt"
  "${launcher[@]}" "$build/bin/train_gpt" "${tiny[@]}" --steps 1000000 --save-every 20 --save-dir "$mnt/ck" \
    >"$work/out" 2>&1 &
  pid=$!
  if [ "$ro" = 1 ]; then
    while [ ! -f "$mnt/ck/latest" ] && kill -0 $pid 2>/dev/null; do sleep 0.01; done
    mount -o remount,ro "$mnt"
  fi
  start=$SECONDS
  wait $pid
  rc=$?
  local seconds=$((SECONDS - start))
  errors=$(grep -c '^error:' "$work/out")
  newest=$(sed -n 's/.*the newest checkpoint is still \([^ ]*\)$/\1/p' "$work/out" | head -n 1)
  local line
  line=$(grep '^error:' "$work/out" | head -n 1)
  # The newest checkpoint loads: continue it for 2 steps, saving elsewhere.
  local step resumed=no
  step=$(basename "$newest" | sed 's/step_0*//')
  if [ -n "$newest" ] && "${launcher[@]}" "$build/bin/train_gpt" --threads 1 --resume "$newest" --steps $((step + 2)) \
       --save-dir "$work/elsewhere" >"$work/resumed" 2>&1 && grep -q "^resumed from $newest " "$work/resumed"; then
    resumed=yes
  fi
  rm -rf "$work/elsewhere"
  umount "$mnt"
  local verdict=ok
  if [ "$rc" != 1 ] || [ "$errors" != 1 ] || [ "$resumed" != yes ]; then verdict=FAILED; failures=$((failures + 1)); fi
  echo "$verdict: $name: exit $rc (the run took ${seconds} s in all), $errors error line(s), newest checkpoint loads: $resumed"
  echo "    $line"
}

run_case "disk full (2 MiB tmpfs), 1 rank" 1 2m 0
run_case "disk full (2 MiB tmpfs), 4 ranks" 4 2m 0
run_case "remounted read-only after the first checkpoint, 1 rank" 1 64m 1
run_case "remounted read-only after the first checkpoint, 4 ranks" 4 64m 1
exit $((failures > 0))
