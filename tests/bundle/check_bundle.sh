#!/usr/bin/env bash
# Proves that a folder made by scripts/gpu_bundle.sh runs on its own: every check starts the bundle's
# binaries from an empty scratch folder with a cleared environment (env -i), so nothing comes from
# this build tree, PATH, LD_LIBRARY_PATH or the source tree:
#   1. ldd: every library of every binary and carried library resolves inside the bundle, to the
#      base system (glibc, libstdc++, libgcc_s) or to what a CUDA machine has (driver, CUDA runtime,
#      cuBLAS); the binaries' RUNPATH is $ORIGIN/../lib;
#   2. zero_tests runs a few CPU suites, GptParity among them, which reads the committed PyTorch
#      reference from the bundle's share/zero; a copy of zero_tests beside a damaged reference must
#      then fail, so the bundle's file (not the source tree's) is the one read;
#   3. train_gpt trains a tiny model for 3 steps on the bundled corpus (an MPI singleton, with the
#      bundle's Open MPI plugins: OPAL_PREFIX as gpu_check.sh sets it), and 2 ranks under the bundled
#      mpirun when there is one; the metrics must show finite losses; as root, another PMIx's folder
#      stands where the system's is, and the bundle's PMIx must not load its plugins;
#   4. the GPU test filters of scripts/gpu_check.py leave out no test whose name says it needs a GPU, and
#      (a bundle with CUDA) every GPU step lists at least its minimum number of tests;
#   5. gpu_check.sh --prebuilt DIR without looking for a GPU (ZERO_GPU_CHECK_NO_GPU=1) runs every step
#      and does not report "ok": the GPU tests skip, the training runs on cuda fail.
#
#   tests/bundle/check_bundle.sh DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ $# -ne 1 ] || [ ! -f "$1/manifest.json" ]; then
  echo "usage: tests/bundle/check_bundle.sh BUNDLE_DIR (a folder made by scripts/gpu_bundle.sh)" >&2
  exit 2
fi
dir=$(cd "$1" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch"
fail() { echo "check_bundle: FAIL: $*" >&2; exit 1; }
pass() { echo "check_bundle: ok: $*"; }

# The bundle's binaries need the CPU level they were built for (SIGILL otherwise).
cpu_arch=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["cpu_arch"])' "$dir/manifest.json")
if [ "$cpu_arch" = x86-64-v3 ]; then
  for flag in avx2 fma bmi2 movbe; do
    grep -qw "$flag" /proc/cpuinfo ||
      fail "this CPU lacks $flag, which x86-64-v3 binaries need: make the bundle with ZERO_ARCH=x86-64-v2 to check it here"
  done
fi

# ---- 1. ldd ----
left_out=$(python3 -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))["left_to_the_gpu_machine"]["libraries"]))' \
           "$dir/manifest.json")
n=0
for f in "$dir"/bin/* "$dir"/lib/*.so*; do
  [ "$(head -c 4 "$f" | tail -c 3)" = ELF ] || continue
  n=$((n + 1))
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    case "$path" in "$dir"/*) continue ;; esac
    case "$name" in
      libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libutil.so.*|libresolv.so.*|ld-linux*) continue ;;
      libstdc++.so.*|libgcc_s.so.*) continue ;;
      libcuda.so.*|libnvidia-*|libcudart.so.*|libcublas.so.*|libcublasLt.so.*) continue ;;
    esac
    [[ " $left_out " == *" $name "* ]] && continue
    fail "$f needs $name, found at '$path': outside the bundle"
  done < <(env -i /usr/bin/ldd "$f" 2>&1)
done
for b in zero_tests zero_dist_tests train_gpt; do
  readelf -d "$dir/bin/$b" | grep -qE 'R(UN)?PATH.*\$ORIGIN/\.\./lib' || fail "$b has no \$ORIGIN/../lib RUNPATH"
done
pass "ldd: $n binaries and libraries resolve inside the bundle, the base system or the CUDA machine's own libraries"
# Without NCCL the check still runs the steps of the binaries that do not load it: its list of those
# that do (NCCL_BINARIES) must be what the binaries' own NEEDED entries say.
if python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["cuda"] else 1)' "$dir/manifest.json"; then
  listed=$(python3 -c "import sys; sys.path.insert(0, sys.argv[1]); import gpu_check as g; print(' '.join(sorted(g.NCCL_BINARIES)))" \
           "$root/scripts")
  loading=$(for b in zero_tests zero_dist_tests train_gpt; do
              readelf -d "$dir/bin/$b" | grep -q 'NEEDED.*\[libnccl' && echo "$b"; done | sort | paste -sd' ')
  [ "$listed" = "$loading" ] || fail "gpu_check.py's NCCL_BINARIES is '$listed'; the binaries that load libnccl are '$loading'"
  pass "NCCL is loaded by $loading alone, as gpu_check.py's NCCL_BINARIES says"
fi

# ---- 2. zero_tests: CPU suites, data found beside the binary ----
filter='GptParity.*:TensorView.*:OptimAdamW.*:Safetensors.*'
env -i "$dir/bin/zero_tests" --gtest_brief=1 --gtest_filter="$filter" >"$scratch/unit.log" 2>&1 ||
  { tail -n 30 "$scratch/unit.log" >&2; fail "zero_tests --gtest_filter=$filter"; }
count=$(grep -o '\[  PASSED  \] [0-9]* test' "$scratch/unit.log" | grep -o '[0-9]*' || echo 0)
[ "${count:-0}" -ge 4 ] || fail "zero_tests ran ${count:-0} tests of $filter"
pass "zero_tests: $count CPU tests passed ($filter)"
# The same binary beside a damaged reference file must fail: it reads the bundle's copy.
mkdir -p "$scratch/b2/bin" "$scratch/b2/share/zero/tests/data"
cp "$dir/bin/zero_tests" "$scratch/b2/bin/"
ln -s "$dir/lib" "$scratch/b2/lib"
echo '{"damaged": true}' >"$scratch/b2/share/zero/tests/data/gpt_reference.json"
if env -i "$scratch/b2/bin/zero_tests" --gtest_brief=1 --gtest_filter='GptParity.*' >"$scratch/damaged.log" 2>&1; then
  fail "zero_tests passed GptParity beside a damaged gpt_reference.json: it does not read the data beside itself"
fi
pass "zero_tests reads tests/data from beside itself (a damaged copy there makes GptParity fail)"

# ---- 3. train_gpt on the bundled corpus ----
# The environment gpu_check.sh --prebuilt gives the bundle's Open MPI, and nothing more.
mpi_env=(OPAL_PREFIX="$dir" PATH="$dir/bin" HWLOC_PLUGINS_PATH="$dir/lib/hwloc" OMPI_MCA_plm=isolated
         OMP_NUM_THREADS=1)
[ -d "$dir/pmix" ] && mpi_env+=(PMIX_PKGLIBDIR="$dir/pmix/lib/pmix"
                                  PMIX_MCA_mca_base_component_path="$dir/pmix/lib/pmix")
# Where root may make a private mount namespace, the system's Open MPI and hwloc plugin and data
# folders are hidden as well, as on a machine that has none. The system's PMIx folder is replaced by
# one like another PMIx version's, as a GPU host may have: a plugin that does not load where the bundle's
# libpmix was built to look first (Note [PMIx's plugin folder] in scripts/gpu_check.py). The bundle's
# PMIx must not try it: its error ("pmix_mca_base_component_repository_open") fails the runs below.
isolate=() hidden="" other_pmix=0
if [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
  mkdir -p "$scratch/empty"
  mounts=""
  for d in $(ompi_info --path pkglibdir --parsable 2>/dev/null | awk -F: '{print $NF}') \
           $(ompi_info --path pkgdatadir --parsable 2>/dev/null | awk -F: '{print $NF}') \
           /usr/lib/*/pmix2 /usr/lib/*/pmix /usr/lib/*/hwloc; do
    [ -d "$d" ] || continue
    case "$d" in
      */pmix2|*/pmix)
        other_pmix=$((other_pmix + 1))
        other="$scratch/other_pmix$other_pmix"
        mkdir -p "$other/lib/pmix"
        echo "not a shared library" >"$other/lib/pmix/pmix_mca_pcompress_zlib.so"
        mounts+="mount --bind '$other' '$d' && " ;;
      *) mounts+="mount --bind '$scratch/empty' '$d' && " ;;
    esac
    hidden+=" $d"
  done
  [ -n "$mounts" ] && isolate=(unshare -m sh -c "${mounts}exec \"\$0\" \"\$@\"")
fi
tiny=(--data "$dir/data/corpus.txt" --steps 3 --n-layer 1 --n-head 2 --n-embd 32 --block 32 --batch 4
      --eval-every 0 --eval-iters 2 --sample 0 --log-every 1)
check_metrics() {  # check_metrics FILE WORLD
  python3 - "$1" "$2" <<'PY' || fail "train_gpt metrics $1"
import json, math, sys
m = json.load(open(sys.argv[1]))
ok = m["steps"] == 3 and m["world_size"] == int(sys.argv[2]) and math.isfinite(m["train_loss"]) and m["train_loss"] > 0
sys.exit(0 if ok else 1)
PY
}
"${isolate[@]}" env -i "${mpi_env[@]}" "$dir/bin/train_gpt" "${tiny[@]}" --metrics "$scratch/m1.json" \
  >"$scratch/train1.log" 2>&1 || { tail -n 20 "$scratch/train1.log" >&2; fail "train_gpt (1 process)"; }
check_metrics "$scratch/m1.json" 1
no_foreign_pmix() {  # no_foreign_pmix LOG: the bundle's PMIx loaded only its own plugins
  ! grep -q "pmix_mca_base_component_repository_open\|PMIx was unable" "$1" ||
    { grep -m 3 "pmix_mca_base_component_repository_open\|PMIx was unable" "$1" >&2
      fail "PMIx tried a plugin outside the bundle ($1)"; }
}
no_foreign_pmix "$scratch/train1.log"
loss=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["train_loss"], 3))' "$scratch/m1.json")
pass "train_gpt: 3 steps on the bundled corpus, train loss $loss${hidden:+ (system folders hidden, the PMIx one replaced by a foreign one:$hidden)}"
if [ -x "$dir/bin/mpirun" ]; then
  as_root=()
  [ "$(id -u)" = 0 ] && as_root=(--allow-run-as-root)
  "${isolate[@]}" env -i "${mpi_env[@]}" "$dir/bin/mpirun" "${as_root[@]}" \
    --oversubscribe --bind-to none -np 2 "$dir/bin/train_gpt" "${tiny[@]}" --zero-stage 2 \
    --metrics "$scratch/m2.json" >"$scratch/train2.log" 2>&1 ||
    { tail -n 20 "$scratch/train2.log" >&2; fail "the bundle's mpirun -np 2 train_gpt"; }
  check_metrics "$scratch/m2.json" 2
  no_foreign_pmix "$scratch/train2.log"
  pass "the bundle's mpirun: 2 ranks of train_gpt, ZeRO-2"
fi

# ---- 4. the GPU filters cover every test named for a GPU ----
gpu_check_value() {  # a constant of scripts/gpu_check.py, printed by Python
  python3 -c "import sys; sys.path.insert(0, sys.argv[1]); import gpu_check as g; print($1)" "$root/scripts"
}
unit_filter=$(gpu_check_value g.UNIT_FILTER)
[ -n "$unit_filter" ] || fail "no UNIT_FILTER in scripts/gpu_check.py"
list() { env -i "$dir/bin/zero_tests" --gtest_list_tests "$@" | awk '/^[^ ]/{s=$1} /^ /{print s $1}' | sort; }
list >"$scratch/all.txt"
list --gtest_filter="$unit_filter" >"$scratch/gpu.txt"
# Left out on purpose: what the filter's negative patterns (after the '-') name.
list --gtest_filter="${unit_filter#*-}" >"$scratch/excluded.txt"
missed=$(comm -23 "$scratch/all.txt" "$scratch/gpu.txt" | comm -23 - "$scratch/excluded.txt" | grep -Ei 'cuda|gpu|nccl' || true)
[ -z "$missed" ] || fail "gpu_check.py's UNIT_FILTER misses: $missed"
# A *_cuda test whose CPU twin skips would skip on a GPU too, and gpu_check.py would call that
# "tests_skipped": such tests must be left out of the filter.
twins=$(sed -n 's/_cuda$/_cpu/p' "$scratch/gpu.txt" | paste -sd:)
if [ -n "$twins" ]; then
  env -i "$dir/bin/zero_tests" --gtest_brief=1 --gtest_filter="$twins" --gtest_output="json:$scratch/twins.json" \
    >"$scratch/twins.log" 2>&1 || { tail -n 20 "$scratch/twins.log" >&2; fail "the CPU twins of the GPU tests"; }
  always=$(python3 - "$scratch/twins.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(" ".join(suite["name"] + "." + t["name"][: -len("_cpu")] + "_cuda"
               for suite in r["testsuites"] for t in suite["testsuite"] if t.get("result") == "SKIPPED"))
PY
)
  [ -z "$always" ] || fail "these tests skip on every device; leave them out of UNIT_FILTER: $always"
fi
pass "UNIT_FILTER selects $(wc -l <"$scratch/gpu.txt") of $(wc -l <"$scratch/all.txt") unit tests, every one named for a GPU; $(tr ':' '\n' <<<"$twins" | grep -c . ) CPU twins ran, none skipped"
# With CUDA built in, each step's filter lists at least the step's minimum (a CPU-only bundle has only
# the NotBuilt placeholders: the GPU run itself reports "too_few_tests" then).
if python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["cuda"] else 1)' "$dir/manifest.json"; then
  # An MPI singleton that starts no orted (gpu_check.sh sets the same).
  env -i OMPI_MCA_ess_singleton_isolated=1 "$dir/bin/zero_dist_tests" --gtest_list_tests 2>/dev/null | awk '/^[^ ]/{s=$1} /^ /{print s $1}' \
    >"$scratch/dist_all.txt"
  short=$(python3 - "$root/scripts" "$scratch/all.txt" "$scratch/dist_all.txt" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import gpu_check as g
unit, dist = open(sys.argv[2]).read().split(), open(sys.argv[3]).read().split()
for name, flt, minimum, _, _ in g.UNIT_GROUPS:
    n = sum(g.filter_matches(g.group_filter(flt), t) for t in unit)
    print(f"{name}:{n}<{minimum}" if n < minimum else "", end=" ")
for name, _, flt, minimum, _, _ in g.DIST_GROUPS:
    n = sum(g.filter_matches(flt, t) for t in dist)
    print(f"{name}:{n}<{minimum}" if n < minimum else "", end=" ")
PY
)
  [ -z "${short// /}" ] || fail "these GPU steps list fewer tests than their minimum: $short"
  pass "every GPU step of gpu_check.py lists at least its minimum of tests"
fi

# ---- 5. gpu_check.sh cannot pass without a GPU ----
ZERO_GPU_CHECK_NO_GPU=1 "$root/scripts/gpu_check.sh" --prebuilt "$dir" --out "$scratch/gpu_check.json" \
  >"$scratch/gpu_check.log" 2>&1 && fail "gpu_check.sh exited 0 without a GPU"
python3 - "$scratch/gpu_check.json" <<'PY' || { tail -n 30 "$scratch/gpu_check.log" >&2; fail "gpu_check.sh's run without a GPU"; }
import json, sys
r = json.load(open(sys.argv[1]))
steps = r["steps"]
ok = (r["status"] != "ok" and steps["host"]["status"] == "ok" and steps["unit_core"]["tests_run"] > 0
      and all(name in steps for name in ("dist_staged_np1", "train_fp16_zero2_1gpu", "bench_bf16",
                                         "train_fp16_zero2_2rank_host_staged")))
print(f'{r["status"]}: {steps["unit_core"]["tests_run"]} unit_core tests ran, '
      f'{len(steps["unit_core"]["skipped_tests"])} skipped')
sys.exit(0 if ok else 1)
PY
pass "gpu_check.sh --prebuilt without a GPU: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["status"], "-", r["reason"][:120])' "$scratch/gpu_check.json")"
echo "check_bundle: $dir is self-contained ($(du -sh "$dir" | cut -f1))"
