#!/usr/bin/env bash
# Checkpoint save and load time and bytes on disk, at 1, 2 and 4 ranks (ZeRO stage 2), fp32 and fp16,
# for train_gpt's default model (4 layers, 128 channels, block 64) and nanoGPT's GPU-recipe shape
# (6 layers, 6 heads, 384 channels, block 256), beside the expected bytes: weights 4Ψ
# (model.safetensors, fp32), optimizer state 8Ψ for fp32 runs (m, v) and 12Ψ for 16-bit runs (fp32
# master, m, v), split over the ranks' shards; Ψ = parameters. Headers and state.json are the rest.
#
#   bench/checkpoint_bench.sh [--build DIR] [--data PATH] [--dir SCRATCH] [--ranks "1 2 4"]
#
# Save: train_gpt --steps 3 --save-every 1 prints each save's wall time; the median of the three is
# reported. Load: --resume of the last checkpoint (no training left, so the run loads, evaluates once
# and ends), three times; the median of the "resumed ... in X ms" figures (checksum verification of
# every file plus reading this rank's ranges). Times include fsync, so they
# depend on the disk; the machine is shared, so expect noise.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
data=data/tinyshakespeare.txt
scratch=$(mktemp -d /tmp/zero_ckpt_bench.XXXXXX)
ranks="1 2 4"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --dir) scratch="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 1 ;;
  esac
done
trap 'rm -rf "$scratch"' EXIT
mpi=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

printf "%-22s %5s %5s %10s %10s %13s %13s %13s %13s\n" model dtype ranks "save ms" "load ms" "weights B" "expect 4Psi" \
  "optimizer B" "expect"
for model in "default:--n-layer 4 --n-head 4 --n-embd 128 --block 64" \
             "6L/384C:--n-layer 6 --n-head 6 --n-embd 384 --block 256"; do
  name=${model%%:*}
  flags=${model#*:}
  for dtype in fp32 fp16; do
    for np in $ranks; do
      save="$scratch/$name-$dtype-$np"
      rm -rf "$save"
      common=(--data "$data" $flags --batch 4 --eval-iters 1 --eval-every 0 --sample 0 --threads 1 --warmup 1
              --zero-stage 2 --dtype "$dtype")
      out=$("${mpi[@]}" -np "$np" "$build/bin/train_gpt" "${common[@]}" --steps 3 --save-every 1 --save-dir "$save")
      psi=$(sed -n 's/^flat layout: \([0-9]*\) parameters.*/\1/p' <<<"$out")
      save_ms=$(sed -n 's/^checkpoint: .* in \([0-9.]*\) ms$/\1/p' <<<"$out" | median)
      load_ms=$(for r in 1 2 3; do
        "${mpi[@]}" -np "$np" "$build/bin/train_gpt" "${common[@]}" --steps 3 --resume "$save" |
          sed -n 's/^resumed from .* in \([0-9.]*\) ms (verify.*$/\1/p'
      done | median)
      ckpt="$save/$(cat "$save/latest")"
      weights=$(stat -c %s "$ckpt/model.safetensors")
      optimizer=$(cat "$ckpt"/optimizer_rank*.safetensors | wc -c)
      k=8; [ "$dtype" = fp16 ] && k=12
      printf "%-22s %5s %5s %10s %10s %13s %13s %13s %13s\n" "$name (Psi $psi)" "$dtype" "$np" "$save_ms" "$load_ms" \
        "$weights" "$((4 * psi))" "$optimizer" "$((k * psi))"
    done
  done
done
