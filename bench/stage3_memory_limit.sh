#!/usr/bin/env bash
# stage3_memory_limit.sh: the same GPT, the same ranks, the same per-process memory limit, once per ZeRO
# stage: which stages train and which stop with "error: out of memory ...".
#
# The limit is on each rank's address space (prlimit --as, the same as `ulimit -v`): an allocation past
# it fails, train_gpt reports "error: out of memory: ..." once for the job and every rank exits with
# code 1. (A cgroup memory limit would instead have the kernel kill the process, with no message of
# ours.) The address space includes what Open MPI, the threads and the binary reserve, about 250 MiB
# per rank here, not only tensors, so the limit is set well above that.
#
# Model states per rank (the ZeRO paper's Table 1, K = 12 for Adam; in fp32 the same 16 bytes per
# parameter: parameters 4, gradients 4, Adam moments 8): stage 0 16Ψ, stage 1 4Ψ + 4Ψ + 8Ψ/N,
# stage 2 4Ψ + 12Ψ/N, stage 3 16Ψ/N, plus the gathered units at stage 3. Every rank first builds the
# model in fp32 (4Ψ); at stages 0-2 the optimizer copies it into a full flat buffer (4Ψ in fp32), so
# they need about 8Ψ + 250 MiB (650 + 250 MiB for the default model); stage 3 takes its partition one
# parameter at a time and needs the built model plus its states and the gathered units (bound them
# with -- --stage3-max-live-parameters N).
#
#   bench/stage3_memory_limit.sh --limit-mib 900 -- --stage3-max-live-parameters 15000000
#   bench/stage3_memory_limit.sh --limit-mib 1500 --stages "0 2 3" -- --dtype bf16
#
# Flags: --ranks N (4), --limit-mib M (1100, per rank), --stages "S ..." ("0 1 2 3"), --steps S (3),
# --model "train_gpt model flags" ("--n-layer 12 --n-embd 768 --n-head 12 --block 64 --batch 4"),
# --bin DIR (build/bin), --data FILE (data/tinyshakespeare.txt), --out DIR (logs; default a fresh
# /tmp/stage3_memory_limit.*). Anything after "--" goes to every train_gpt run.
set -euo pipefail
cd "$(dirname "$0")/.."

ranks=4 limit_mib=1100 stages="0 1 2 3" steps=3 bin=build/bin data=data/tinyshakespeare.txt out=""
model="--n-layer 12 --n-embd 768 --n-head 12 --block 64 --batch 4"
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --limit-mib) limit_mib=$2; shift 2 ;;
    --stages) stages=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x $bin/train_gpt ]] || { echo "error: $bin/train_gpt not found; build it first" >&2; exit 2; }
[[ -f $data ]] || { echo "error: --data $data not found" >&2; exit 2; }
command -v prlimit > /dev/null || { echo "error: prlimit not found (util-linux)" >&2; exit 2; }
[[ -z $out ]] && out=$(mktemp -d /tmp/stage3_memory_limit.XXXXXX)
mkdir -p "$out"

limit=$((limit_mib * 1024 * 1024))
echo "$ranks ranks, address space limit $limit_mib MiB per rank (prlimit --as=$limit), model: $model ${extra[*]}"
echo "logs in $out"
printf '%-6s %-5s %s\n' stage exit result
for s in $stages; do
  log="$out/stage$s.log"
  rc=0
  # shellcheck disable=SC2086
  timeout 1800 mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ranks" -x OMP_NUM_THREADS=1 \
    prlimit --as="$limit" "$bin/train_gpt" --data "$data" $model --steps "$steps" --eval-iters 1 --eval-every 0 \
    --sample 0 --threads 1 --zero-stage "$s" "${extra[@]}" > "$log" 2>&1 || rc=$?
  if [[ $rc == 0 ]]; then
    result="trained: $(grep -m1 '^done:' "$log" | cut -c1-60); $(grep -m1 -o 'model states [0-9.]* MiB.*peak RSS [0-9.]* MiB' "$log")"
  else
    result=$(grep -m1 '^error:' "$log" || tail -1 "$log")
  fi
  printf '%-6s %-5s %s\n' "$s" "$rc" "$result"
done
