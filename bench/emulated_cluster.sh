#!/usr/bin/env bash
# emulated_cluster.sh: runs train_gpt's data-parallel configurations, and the same model under PyTorch
# DDP and ZeroRedundancyOptimizer over gloo, on an emulated network link, and prints them side by side.
#
# The link: a fresh network namespace whose loopback is rate-limited with a token-bucket filter
# (`tc qdisc ... tbf rate R burst B limit 64mb`). Every rank runs inside it and talks over Open MPI's
# TCP transport on that loopback (--mca btl tcp,self, pml ob1), the code path of a multi-node job
# (README, "Several machines"). All ranks share the one loopback, so each rank's effective bandwidth is
# about R / N. The namespace is removed on exit, also after a failure or Ctrl-C.
#
# --burst B (default 128kb) is the filter's bucket: after an idle gap, up to B bytes pass at memory
# speed. A real link never sends faster than its rate, so B is kept small: two of loopback's 64 KB
# packets (no packet larger than B can pass). With 1mb, 4 ms of a 2 Gbit/s link's traffic passes
# at once after every pause, and a bucket reduce-scatter issued between two layers of backward finds
# the link as good as free: that hides the cost of not overlapping (docs/collectives.md).
#
#   sudo bench/emulated_cluster.sh --ranks 2 --rate 400mbit --steps 30 --rounds 3
#   sudo bench/emulated_cluster.sh --ranks 2 --rate 2gbit --configs "s2_bucket s2_bucket_overlap s2_overlap_gather torch_ddp"
#   sudo bench/emulated_cluster.sh --ranks 4 --rate 2gbit --configs "stage2 stage3 s3_no_prefetch s3_traced"
#
# --batch B sets the global batch of every run (ours and PyTorch's; default 12, train_gpt's): a smaller
# batch means less compute per byte communicated, i.e. a relatively slower link. Every rank computes on
# one thread (train_gpt --threads 1, OMP_NUM_THREADS=1 for PyTorch).
#
# Other flags: --ranks N (2), --rate R (400mbit; tc's units), --steps S (30) and --rounds K (3) per
# configuration, --bucket ELEMENTS (100000, the s2_* and s1_* configurations), --out DIR (logs and
# metrics; default a fresh /tmp/emulated_cluster.*), --bin DIR (build/bin), --data FILE
# (data/tinyshakespeare.txt), --python EXE (/usr/bin/python3, which needs torch for torch_*).
#
# Configurations (--configs, names; default: all):
#   stage0 stage1 stage2          --zero-stage 0/1/2, default buckets
#   s2_rs_off                     stage 2 with "reduce_scatter": false (all-reduce each bucket: 1.5x traffic)
#   s2_bucket                     stage 2, --reduce-bucket-size BUCKET (default 100000), no overlap
#   s2_bucket_overlap             the same with --overlap-comm
#   s2_overlap_gather             the same with --overlap-comm --overlap-param-gather
#   s1_overlap_gather             stage 1 with --overlap-comm --overlap-param-gather
#   stage3                        --zero-stage 3, default prefetch (stage3_prefetch_bucket_size)
#   s3_no_prefetch                stage 3 with --stage3-prefetch-bucket-size 0 (every gather on demand)
#   s3_traced                     stage 3 with --trace of steps 3..S; the summary shows the share of
#                                 gather time hidden (tools/stage3_gather_overlap.py)
#   s3_no_prefetch_traced         the same with --stage3-prefetch-bucket-size 0
#   torch_ddp torch_zero          bench/torch_gpt_dist.py: DDP, DDP + ZeroRedundancyOptimizer (gloo)
#   wire_fp32 wire_bf16 wire_bf16_acc wire_int8 wire_int8_ef
#                                 the gradient wire at stage 2 with --overlap-comm, all with a bf16 model (the
#                                 same compute): --communication-data-type fp32, the bf16 ring,
#                                 --reduce-scatter-with-fp32-accumulation, --zero-quantized-gradients
#                                 without and with --zero-quantized-gradients-error-feedback (not in the
#                                 default list; the summary prints each one's step time against wire_fp32)
#   f32_wire f32_int8             the same with an fp32 model: fp32 wire, --zero-quantized-gradients (the
#                                 summary compares them)
# Runs go round-robin (--rounds times through the list), so load from other jobs on the machine
# spreads over all configurations; the table shows medians over rounds. Needs root (ip netns, tc).
# Anything after "--" is passed to every train_gpt run (e.g. -- --dtype fp16).
set -euo pipefail
cd "$(dirname "$0")/.."

ranks=2 rate=400mbit burst=128kb steps=30 rounds=3 bucket=100000 batch=12
bin=build/bin data=data/tinyshakespeare.txt out="" python=/usr/bin/python3
configs="stage0 stage1 stage2 s2_rs_off s2_bucket s2_bucket_overlap s2_overlap_gather s1_overlap_gather stage3 s3_no_prefetch torch_ddp torch_zero"
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --burst) burst=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --bucket) bucket=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $(id -u) == 0 ]] || { echo "error: needs root for 'ip netns' and 'tc' (run with sudo)" >&2; exit 2; }
[[ -x $bin/train_gpt ]] || { echo "error: $bin/train_gpt not found; build it first (scripts/test.sh)" >&2; exit 2; }
[[ -f $data ]] || { echo "error: --data $data not found" >&2; exit 2; }
[[ -z $out ]] && out=$(mktemp -d /tmp/emulated_cluster.XXXXXX)
mkdir -p "$out"

ns=zero_emu_$$
cleanup() { ip netns del "$ns" 2>/dev/null || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM
ip netns add "$ns"
ip netns exec "$ns" ip link set lo up
# limit: bytes that may queue in the filter. A small one drops packets and TCP then stalls for
# seconds (or the job hangs); 64 MB never fills at these message sizes.
ip netns exec "$ns" tc qdisc add dev lo root tbf rate "$rate" burst "$burst" limit 64mb
echo "emulated link: $(ip netns exec "$ns" tc qdisc show dev lo | head -1)"
echo "ranks $ranks, $steps steps x $rounds rounds, results in $out"

echo '{"zero_optimization": {"reduce_scatter": false}}' > "$out/rs_off.json"
mpirun_flags=(--allow-run-as-root --oversubscribe --bind-to none --mca btl tcp,self --mca btl_tcp_if_include lo
              --mca oob_tcp_if_include lo --mca pml ob1 -x OMP_NUM_THREADS=1)
# ZERO_COLLECTIVE_IDENTITY=0 in the environment reaches every rank (bench/identity_cost.sh says what it is).
[[ -n ${ZERO_COLLECTIVE_IDENTITY:-} ]] && mpirun_flags+=(-x ZERO_COLLECTIVE_IDENTITY)
common=(--data "$data" --steps "$steps" --batch "$batch" --threads 1 --eval-every 0 --eval-iters 2 --sample 0 --log-every "$steps")

flags_of() {
  case "$1" in
    stage0) echo "--zero-stage 0" ;;
    stage1) echo "--zero-stage 1" ;;
    stage2) echo "--zero-stage 2" ;;
    s2_rs_off) echo "--zero-stage 2 --config $out/rs_off.json" ;;
    s2_bucket) echo "--zero-stage 2 --reduce-bucket-size $bucket" ;;
    s2_bucket_overlap) echo "--zero-stage 2 --reduce-bucket-size $bucket --overlap-comm" ;;
    s2_overlap_gather) echo "--zero-stage 2 --reduce-bucket-size $bucket --overlap-comm --overlap-param-gather" ;;
    s1_overlap_gather) echo "--zero-stage 1 --reduce-bucket-size $bucket --overlap-comm --overlap-param-gather" ;;
    wire_fp32) echo "--zero-stage 2 --overlap-comm --dtype bf16 --communication-data-type fp32" ;;
    wire_bf16) echo "--zero-stage 2 --overlap-comm --dtype bf16" ;;
    wire_bf16_acc) echo "--zero-stage 2 --overlap-comm --dtype bf16 --reduce-scatter-with-fp32-accumulation" ;;
    wire_int8) echo "--zero-stage 2 --overlap-comm --dtype bf16 --zero-quantized-gradients" ;;
    wire_int8_ef) echo "--zero-stage 2 --overlap-comm --dtype bf16 --zero-quantized-gradients --zero-quantized-gradients-error-feedback" ;;
    f32_wire) echo "--zero-stage 2 --overlap-comm --dtype fp32" ;;
    f32_int8) echo "--zero-stage 2 --overlap-comm --dtype fp32 --zero-quantized-gradients" ;;
    stage3) echo "--zero-stage 3" ;;
    s3_no_prefetch) echo "--zero-stage 3 --stage3-prefetch-bucket-size 0" ;;
    s3_traced) echo "--zero-stage 3 --trace $out/trace.s3_traced.$round.json --trace-steps 3:$steps" ;;
    s3_no_prefetch_traced) echo "--zero-stage 3 --stage3-prefetch-bucket-size 0 --trace $out/trace.s3_no_prefetch_traced.$round.json --trace-steps 3:$steps" ;;
    torch_ddp) echo "" ;;
    torch_zero) echo "--zero" ;;
    *) echo "error: unknown configuration '$1'" >&2; return 1 ;;
  esac
}

for round in $(seq 1 "$rounds"); do
  for c in $configs; do
    f=$(flags_of "$c")
    log="$out/$c.$round.log"
    if [[ $c == torch_* ]]; then
      # A gloo rank can linger at process-group teardown after the results are written: wait for the
      # metrics file, give the job 10 s more to exit, then end it.
      # shellcheck disable=SC2086
      ip netns exec "$ns" env OMP_NUM_THREADS=1 setsid "$python" bench/torch_gpt_dist.py --world-size "$ranks" $f \
        --data "$data" --steps "$steps" --batch "$batch" --eval-iters 2 --log-every "$steps" --metrics "$out/$c.$round.json" \
        > "$log" 2>&1 &
      pid=$!
      for _ in $(seq 1 900); do [[ -f $out/$c.$round.json ]] || ! kill -0 "$pid" 2>/dev/null && break; sleep 1; done
      for _ in $(seq 1 10); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
      kill -- -"$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      [[ -f $out/$c.$round.json ]] || { echo "run $c (round $round) failed; see $log" >&2; tail -5 "$log" >&2; exit 1; }
    else
      # shellcheck disable=SC2086
      timeout 900 ip netns exec "$ns" mpirun "${mpirun_flags[@]}" -np "$ranks" "$bin/train_gpt" "${common[@]}" $f \
        "${extra[@]}" --metrics "$out/$c.$round.json" --log-file "$out/$c.$round.jsonl" \
        > "$log" 2>&1 || { echo "run $c (round $round) failed; see $log" >&2; tail -5 "$log" >&2; exit 1; }
    fi
    printf 'round %d %-18s %s\n' "$round" "$c" "$("$python" -c 'import json,sys; m=json.load(open(sys.argv[1])); print("%.1f ms/step" % m["ms_per_step"])' "$out/$c.$round.json")"
  done
done

"$python" - "$out" "$rate" "$ranks" $configs <<'EOF'
import glob, json, statistics, sys
out, rate, ranks, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
rows = {}
for n in names:
    ms = [json.load(open(p)) for p in sorted(glob.glob(f"{out}/{n}.*.json"))]
    if not ms:
        continue
    med = lambda k: statistics.median(m[k] for m in ms) if all(k in m for m in ms) else float("nan")
    comm = med("comm_ms_per_step")
    cpu = med("comm_cpu_ms_per_step")
    traffic = statistics.median(m["comm_bytes_per_step"]["total"] for m in ms) if "comm_bytes_per_step" in ms[0] else float("nan")
    rows[n] = (med("ms_per_step"), med("tokens_per_s"), comm, traffic, len(ms), cpu)
def step_ms(name, round_glob="*"):
    # Median of the per-step times (train_gpt --log-file lines, rank 0's clock) after the first two steps.
    ms = []
    for path in glob.glob(f"{out}/{name}.{round_glob}.jsonl"):
        for line in open(path):
            j = json.loads(line)
            if "ms" in j and j["step"] > 2:
                ms.append(j["ms"])
    return statistics.median(ms) if ms else float("nan")
print(f"\nlink {rate}, {ranks} ranks; medians over rounds")
print(f"{'configuration':20s} {'ms/step':>9s} {'tokens/s':>9s} {'comm ms/step':>13s} {'comm CPU ms/step':>17s} "
      f"{'wire MB/step':>13s} {'runs':>5s}")
for n, (ms, tps, comm, traffic, k, cpu) in rows.items():
    print(f"{n:20s} {ms:9.1f} {tps:9.0f} {comm:13.1f} {cpu:17.1f} {traffic / 1e6:13.2f} {k:5d}")
def ratio(a, b, i=0):
    return rows[a][i] / rows[b][i] if a in rows and b in rows else float("nan")
def paired(a, b):
    # Median over rounds of a/b within each round: the two runs were next to each other in time, so
    # load that drifts over minutes on a shared machine cancels in the ratio.
    rs = []
    for path in glob.glob(f"{out}/{a}.*.json"):
        other = path.replace(f"/{a}.", f"/{b}.")
        try:
            rs.append(json.load(open(path))["ms_per_step"] / json.load(open(other))["ms_per_step"])
        except OSError:
            pass
    return statistics.median(rs) if rs else float("nan")
print()
if "s2_rs_off" in rows and "stage2" in rows:
    print(f"reduce_scatter false / true (stage 2): step time {ratio('s2_rs_off', 'stage2'):.2f}x, "
          f"communication time {ratio('s2_rs_off', 'stage2', 2):.2f}x, wire bytes {ratio('s2_rs_off', 'stage2', 3):.2f}x")
if "s2_bucket" in rows and "s2_bucket_overlap" in rows:
    print(f"--overlap-comm saves {100 * (1 - ratio('s2_bucket_overlap', 's2_bucket')):.1f}% of step time "
          f"(same buckets); --overlap-param-gather a further {100 * (1 - ratio('s2_overlap_gather', 's2_bucket_overlap')):.1f}%")
    print(f"  the same as medians of the ratio within each round: {100 * (1 - paired('s2_bucket_overlap', 's2_bucket')):.1f}% "
          f"and {100 * (1 - paired('s2_overlap_gather', 's2_bucket_overlap')):.1f}%")
for w in ("wire_bf16", "wire_bf16_acc", "wire_int8", "wire_int8_ef"):
    if w in rows and "wire_fp32" in rows:
        print(f"{w} vs wire_fp32: step time {ratio(w, 'wire_fp32'):.2f}x (paired {paired(w, 'wire_fp32'):.2f}x), "
              f"wire bytes {ratio(w, 'wire_fp32', 3):.3f}x, speed-up {1 / paired(w, 'wire_fp32'):.2f}x")
if "f32_int8" in rows and "f32_wire" in rows:
    print(f"f32_int8 vs f32_wire: step time {ratio('f32_int8', 'f32_wire'):.2f}x (paired {paired('f32_int8', 'f32_wire'):.2f}x), "
          f"wire bytes {ratio('f32_int8', 'f32_wire', 3):.3f}x, speed-up {1 / paired('f32_int8', 'f32_wire'):.2f}x")
for s3 in ("stage3", "s3_no_prefetch", "s3_traced", "s3_no_prefetch_traced"):
    if s3 in rows and "stage2" in rows:
        per_round = [step_ms(s3, str(r)) / step_ms("stage2", str(r))
                     for r in range(1, 1000) if glob.glob(f"{out}/{s3}.{r}.jsonl") and glob.glob(f"{out}/stage2.{r}.jsonl")]
        print(f"{s3} / stage2: median step {step_ms(s3):.1f} / {step_ms('stage2'):.1f} ms = "
              f"{step_ms(s3) / step_ms('stage2'):.2f}x; per round {' '.join(f'{r:.2f}' for r in per_round)}; "
              f"ms_per_step {ratio(s3, 'stage2'):.2f}x; wire bytes {ratio(s3, 'stage2', 3):.2f}x")
for t in ("torch_ddp", "torch_zero"):
    best = min((n for n in rows if not n.startswith("torch")), key=lambda n: rows[n][0], default=None)
    if t in rows and best:
        print(f"tokens/s: {best} {rows[best][1]:.0f} vs {t} {rows[t][1]:.0f} ({ratio(best, t, 1):.2f}x)")
EOF
for t in "$out"/trace.s3_*.json; do
  [[ -f $t ]] || continue
  echo; echo "gather time hidden, $(basename "$t"):"
  "$python" tools/stage3_gather_overlap.py "$t"
done
