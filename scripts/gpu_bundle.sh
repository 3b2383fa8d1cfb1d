#!/usr/bin/env bash
# Packs a self-contained folder that scripts/gpu_check.sh --prebuilt DIR runs on a GPU machine which has
# the NVIDIA driver and CUDA toolkit but nothing else this project needs (no Eigen, fmt, MPI, GTest):
#   DIR/bin/    zero_tests, zero_dist_tests, train_gpt, gpu_probe (tools/gpu_probe.cpp), and Open MPI's
#               mpirun and orted (best effort), stripped; built for a portable CPU level (ZERO_ARCH,
#               default x86-64-v3: AVX2 + FMA), never -march=native;
#   DIR/lib/    every shared library they load except glibc, libstdc++/libgcc_s and what a CUDA machine
#               has (the driver, the CUDA runtime, cuBLAS); each library's RUNPATH is set to $ORIGIN
#               (patchelf) and each binary's to $ORIGIN/../lib, so nothing depends on the environment;
#               Open MPI's plugins and help files are mirrored below DIR as its /usr layout has them,
#               PMIx's plugins are in DIR/pmix (hwloc's optional plugins are not carried);
#   DIR/share/zero/   the test data and example configs the test binary reads (tests/unit/test_paths.h
#               looks there, beside the binary, first);
#   DIR/data/corpus.txt   data/tinyshakespeare.txt if present, else scripts/make_corpus.py's text;
#   DIR/manifest.json     what was built, for which CUDA architectures, and what was left out.
# NCCL is carried when it is at most ZERO_BUNDLE_NCCL_MAX_MB (default 24) MiB: recent NCCL releases
# are ~200 MiB (device code for every architecture), more than a bundle may weigh, so such a NCCL is
# left to the GPU machine (its toolkit, or the nvidia-nccl wheel) and the manifest says so.
# The step fails when `ldd` shows any library resolving outside DIR, the base system and the toolkit.
#
#   scripts/gpu_bundle.sh DIR          (or scripts/gpu_check.sh --bundle DIR)
#
# ZERO_BUNDLE_BUILD=DIR builds there (default build-bundle); ZERO_BUNDLE_CUDA=ON|OFF|AUTO (default ON:
# OFF makes a CPU-only bundle, which only tests/bundle/check_bundle.sh has a use for); CUDA_ARCHS
# (default 90, the H100/H200); ZERO_ARCH (default x86-64-v3).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -eq 1 ] || { echo "usage: scripts/gpu_bundle.sh DIR" >&2; exit 2; }
dir="$1"
build="${ZERO_BUNDLE_BUILD:-$root/build-bundle}"
cuda="${ZERO_BUNDLE_CUDA:-ON}"
archs="${CUDA_ARCHS:-90}"
cpu_arch="${ZERO_ARCH:-x86-64-v3}"
nccl_max_mb="${ZERO_BUNDLE_NCCL_MAX_MB:-24}"

# A folder that holds anything but an earlier bundle (manifest.json), or one this script began to pack
# (.gpu_bundle, written first), is never overwritten.
if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ] && [ ! -f "$dir/manifest.json" ] &&
   [ ! -f "$dir/.gpu_bundle" ]; then
  echo "gpu_bundle: $dir exists and is not a bundle (no manifest.json); give an empty or new folder" >&2
  exit 2
fi
command -v patchelf >/dev/null ||
  { echo "gpu_bundle: patchelf is needed to point the carried libraries at each other (apt-get install patchelf)" >&2
    exit 1; }

# ---- build ----
mkdir -p "$build"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
echo "gpu_bundle: building (Release, -march=$cpu_arch, CUDA $cuda, sm_$archs) in $build"
t0=$(date +%s)
# The install RUNPATH at build time: the binaries look in ../lib first, then the standard toolkit path.
# shellcheck disable=SC2016
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DZERO_CUDA="$cuda" -DZERO_BUILD_BENCH=OFF \
       -DZERO_INSTALL=OFF -DZERO_NATIVE=OFF -DZERO_ARCH="$cpu_arch" -DCMAKE_CUDA_ARCHITECTURES="$archs" \
       -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib;/usr/local/cuda/lib64' \
       "${launcher[@]}" >"$build/bundle.configure.log" 2>&1; then
  tail -n 30 "$build/bundle.configure.log" >&2
  echo "gpu_bundle: configure failed (log: $build/bundle.configure.log)" >&2
  exit 1
fi
if ! cmake --build "$build" -j"$(nproc)" --target zero_tests zero_dist_tests train_gpt >"$build/bundle.build.log" 2>&1; then
  tail -n 30 "$build/bundle.build.log" >&2
  echo "gpu_bundle: build failed (log: $build/bundle.build.log)" >&2
  exit 1
fi
with_cuda=$(grep -q '^ZERO_WITH_CUDA:INTERNAL=ON' "$build/CMakeCache.txt" 2>/dev/null && echo ON ||
            (grep -q 'CUDA backend ON' "$build/bundle.configure.log" && echo ON || echo OFF))
echo "gpu_bundle: built in $(( $(date +%s) - t0 ))s (CUDA backend $with_cuda)"

# ---- pack ----
rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/lib" "$dir/share/zero/tests" "$dir/share/zero/examples" "$dir/data"
echo "packed by scripts/gpu_bundle.sh; complete once manifest.json exists" >"$dir/.gpu_bundle"
dir=$(cd "$dir" && pwd)
cp "$build"/bin/{zero_tests,zero_dist_tests,train_gpt} "$dir/bin/"
if [ "$with_cuda" = ON ]; then
  nvcc=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
  "${nvcc:-nvcc}" -O2 -o "$dir/bin/gpu_probe" "$root/tools/gpu_probe.cpp" -ldl
fi
cp -r "$root/tests/data" "$dir/share/zero/tests/data"
cp -r "$root/examples/configs" "$dir/share/zero/examples/configs"
if [ -f "$root/data/tinyshakespeare.txt" ]; then
  cp "$root/data/tinyshakespeare.txt" "$dir/data/corpus.txt"
  echo "Tiny Shakespeare" >"$dir/data/corpus.txt.source"
else
  python3 "$root/scripts/make_corpus.py" "$dir/data/corpus.txt"
  echo "synthetic corpus from the repository's text (scripts/make_corpus.py): losses not comparable" \
    >"$dir/data/corpus.txt.source"
fi

# Open MPI: mpirun and orted (an MPI singleton starts one), and the plugin and help folders under the
# prefix-relative paths that OPAL_PREFIX=DIR makes Open MPI read (gpu_check.sh sets it).
mpi_dirs=()
if command -v mpirun >/dev/null && command -v ompi_info >/dev/null; then
  cp -L "$(command -v mpirun)" "$dir/bin/mpirun"
  command -v orted >/dev/null && cp -L "$(command -v orted)" "$dir/bin/orted"
  prefix=$(ompi_info --path prefix --parsable | awk -F: '{print $NF}')
  for key in pkglibdir pkgdatadir; do
    src=$(ompi_info --path "$key" --parsable | awk -F: '{print $NF}')
    case "$src" in "$prefix"/*) ;; *) continue ;; esac
    [ -d "$src" ] || continue
    mkdir -p "$dir/${src#"$prefix"/}"
    cp -rL "$src/." "$dir/${src#"$prefix"/}/"
    mpi_dirs+=("$dir/${src#"$prefix"/}")
  done
  # Debian's Open MPI runs on an external PMIx whose own plugins live under its prefix:
  # PMIX_PKGLIBDIR=DIR/pmix/lib/pmix points it there (gpu_check.sh sets it; Note [PMIx's plugin folder]
  # in scripts/gpu_check.py).
  for pmix in /usr/lib/*/pmix2 /usr/lib/*/pmix; do
    [ -d "$pmix/lib/pmix" ] || continue
    mkdir -p "$dir/pmix/lib"
    cp -rL "$pmix/lib/pmix" "$dir/pmix/lib/"
    [ -d "$pmix/share" ] && cp -rL "$pmix/share" "$dir/pmix/"
    mpi_dirs+=("$dir/pmix/lib/pmix")
    break
  done
fi

# Base system and CUDA-machine libraries stay behind; everything else is copied, with what it needs.
is_base() {  # glibc, the compiler's C++ runtime, the dynamic loader
  case "$(basename "$1")" in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libutil.so.*|libresolv.so.*|ld-linux*.so.*| \
    libstdc++.so.*|libgcc_s.so.*) return 0 ;;
  esac
  return 1
}
is_cuda_machine() {  # the driver and the toolkit's runtime and cuBLAS
  case "$(basename "$1")" in
    libcuda.so.*|libnvidia-*.so*|libcudart.so.*|libcublas.so.*|libcublasLt.so.*) return 0 ;;
  esac
  return 1
}
external=()
copy_deps() {  # copy_deps FILE...: copies every non-base dependency ldd resolves for FILE
  local lib
  for lib in $(ldd "$@" 2>/dev/null | awk '/=> \//{print $3}' | sort -u); do
    is_base "$lib" && continue
    is_cuda_machine "$lib" && continue
    local name; name=$(basename "$lib")
    [ -e "$dir/lib/$name" ] && continue
    if [[ "$name" == libnccl.so* ]] && [ "$(stat -L -c %s "$lib")" -gt $(( nccl_max_mb * 1024 * 1024 )) ]; then
      [[ " ${external[*]-} " == *" $name "* ]] || external+=("$name")
      continue
    fi
    cp -L "$lib" "$dir/lib/$name"
  done
}
bins=("$dir"/bin/*)
copy_deps "${bins[@]}"
plugins=()
for d in "${mpi_dirs[@]}"; do while IFS= read -r f; do plugins+=("$f"); done < <(find "$d" -name '*.so' -type f); done
[ ${#plugins[@]} -gt 0 ] && copy_deps "${plugins[@]}"
copy_deps "$dir"/lib/*.so*  # what the copies need in turn
strip --strip-unneeded "${bins[@]}" "$dir"/lib/*.so* 2>/dev/null || true
# Each carried library finds its neighbours; each plugin finds the carried libraries.
for f in "$dir"/lib/*.so*; do patchelf --set-rpath '$ORIGIN' "$f"; done
for f in "${plugins[@]}"; do patchelf --set-rpath "\$ORIGIN/$(realpath --relative-to="$(dirname "$f")" "$dir/lib")" "$f"; done
for f in "$dir"/bin/mpirun "$dir"/bin/orted "$dir"/bin/gpu_probe; do
  [ -e "$f" ] && patchelf --set-rpath '$ORIGIN/../lib' "$f"
done

# ---- check: from elsewhere, with an empty environment, nothing may resolve outside DIR, the base
# system and the CUDA machine's own libraries (NCCL only when it was left out above) ----
bad=$(cd / && for f in "$dir"/bin/* "$dir"/lib/*.so* "${plugins[@]}"; do
        [ "$(head -c 4 "$f" | tail -c 3)" = ELF ] || continue
        env -i /usr/bin/ldd "$f" 2>&1 | sed "s|^|$f: |"
      done | awk -v d="$(cd "$dir" && pwd)" '
        / => / { lib = $2; path = $4 }
        / => / && $4 == "not" { print; next }
        / => \// { if (index(path, d "/") == 1) next; print }' |
      while IFS= read -r line; do
        path=$(awk '{print $4}' <<<"$line")
        name=$(awk '{print $2}' <<<"$line")
        [ "$path" != "not" ] && { is_base "$path" || is_cuda_machine "$path"; } && continue
        [[ " ${external[*]-} " == *" $name "* ]] && continue
        # A plugin of a transport this machine may lack (InfiniBand, Omni-Path, ...) is allowed to miss
        # a library Open MPI itself does not need: Open MPI skips a plugin that does not load.
        owner=$(dirname "${line%%:*}")
        [ "$path" = "not" ] && [ "$owner" != "$dir/bin" ] && [ "$owner" != "$dir/lib" ] && continue
        echo "$line"
      done)
if [ -n "$bad" ]; then
  echo "$bad" >&2
  echo "gpu_bundle: the libraries above resolve outside $dir (or not at all)" >&2
  exit 1
fi

# ---- manifest: what was built, and what the GPU host must have (scripts/gpu_check.py checks it first) ----
size_kb=$(du -sk "$dir" | cut -f1)
nccl_h="$(sed -n 's/^ZERO_NCCL_INCLUDE_DIR:[A-Z]*=//p' "$build/CMakeCache.txt")/nccl.h"
nccl_version=$(grep -s -o 'NCCL_\(MAJOR\|MINOR\|PATCH\) [0-9]*' "$nccl_h" | awk '{print $2}' | paste -sd. || true)
# The toolkit's version, as CMake found it (its runtime and cuBLAS are what the binaries link).
cuda_version=$(sed -n 's/^set(CMAKE_CUDA_COMPILER_VERSION "\([0-9.]*\)")$/\1/p' \
                 "$build"/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | head -n 1 || true)
[ "$with_cuda" = ON ] || cuda_version=""
commit=$(cd "$root" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
printf '%s\n' "${plugins[@]}" >"$build/bundle.plugins.txt"
python3 - "$dir" "$with_cuda" "$archs" "$cpu_arch" "$size_kb" "${external[*]-}" \
  "$(cat "$dir/data/corpus.txt.source")" "$commit" "$nccl_version" "$cuda_version" "$build/bundle.plugins.txt" <<'PY'
import json, os, re, subprocess, sys
d, cuda, archs, cpu_arch, size_kb, external, corpus, commit, nccl, cuda_version, plugin_list = sys.argv[1:]
def elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False
files = [os.path.join(d, "bin", f) for f in sorted(os.listdir(os.path.join(d, "bin")))]
files += [os.path.join(d, "lib", f) for f in sorted(os.listdir(os.path.join(d, "lib")))]
files += [l.strip() for l in open(plugin_list) if l.strip()]
files = [f for f in files if os.path.isfile(f) and elf(f)]
vt = lambda v: tuple(int(x) for x in v.split("."))
needs = {}      # version family (GLIBC, GLIBCXX, CXXABI, GCC) -> {version: {file: [symbols]}}
needed = set()  # sonames the carried files load
nccl_symbols = set()
for f in files:
    rel = os.path.relpath(f, d)
    for line in subprocess.run(["objdump", "-T", f], capture_output=True, text=True).stdout.splitlines():
        m = re.search(r"\*UND\*\s+\S+\s+(?:\(|)(GLIBC|GLIBCXX|CXXABI|GCC)_([0-9.]+)\)?\s+(\S+)$", line)
        if m:
            needs.setdefault(m.group(1), {}).setdefault(m.group(2), {}).setdefault(rel, []).append(m.group(3))
        m = re.search(r"\*UND\*.*\s(nccl\w+)$", line)
        if m and rel.startswith("bin/"):
            nccl_symbols.add(m.group(1))
    for line in subprocess.run(["objdump", "-p", f], capture_output=True, text=True).stdout.splitlines():
        if line.strip().startswith("NEEDED"):
            needed.add(line.split()[1])
def newest(family):
    if family not in needs:
        return None, ""
    v = max(needs[family], key=vt)
    who = "; ".join(f"{rel}: {', '.join(sorted(set(syms))[:4])}" for rel, syms in sorted(needs[family][v].items()))
    return v, who
glibc, glibc_who = newest("GLIBC")
glibcxx, glibcxx_who = newest("GLIBCXX")
cxxabi, _ = newest("CXXABI")
base = re.compile(r"^(libc|libm|libdl|libpthread|librt|libutil|libresolv)\.so\.|^ld-linux")
carried = set(os.listdir(os.path.join(d, "lib")))
from_host = sorted(n for n in needed if n not in carried and not base.match(n))
# x86-64 micro-architecture levels (the psABI's list), as /proc/cpuinfo names the flags.
cpu_flags = {"x86-64-v2": ["popcnt", "sse4_1", "sse4_2", "ssse3"],
             "x86-64-v3": ["popcnt", "sse4_1", "sse4_2", "ssse3", "avx", "avx2", "bmi1", "bmi2", "f16c", "fma",
                           "movbe"]}.get(cpu_arch, [])
major = cuda_version.split(".")[0] if cuda_version else ""
# The driver branch a CUDA major version needs (CUDA minor version compatibility: any driver of that
# branch or newer runs every minor release of the major; CUDA toolkit release notes, "CUDA Driver").
driver_branch = {"12": "R525", "13": "R580"}.get(major)
host_needs = {
    "glibc": glibc, "glibc_needed_by": glibc_who, "glibcxx": glibcxx, "glibcxx_needed_by": glibcxx_who,
    "cxxabi": cxxabi, "libraries": from_host, "cpu_flags": cpu_flags,
    "cuda_runtime": ".".join(cuda_version.split(".")[:2]) or None,
    "cuda_driver_min": (f"{driver_branch} or newer (nvidia-smi shows CUDA {major}.0 or newer)"
                        if driver_branch else None) if major else None,
    "nccl": {"soname": "libnccl.so.2", "built_against": nccl or None, "symbols": sorted(nccl_symbols)}
            if cuda == "ON" else None,
}
json.dump({"commit": commit, "cuda": cuda == "ON", "cuda_architectures": [int(a) for a in archs.split(";") if a],
           "cpu_arch": cpu_arch, "binaries": sorted(os.listdir(os.path.join(d, "bin"))),
           "libraries": sorted(carried),
           "left_to_the_gpu_machine": {"libraries": external.split(), "nccl_built_against": nccl or None},
           "host_needs": host_needs,
           "corpus": corpus, "size_bytes": int(size_kb) * 1024}, open(os.path.join(d, "manifest.json"), "w"),
          indent=1)
print(f"gpu_bundle: the host needs glibc >= {glibc} ({glibc_who}), libstdc++ with GLIBCXX_{glibcxx}, "
      f"and from the machine: {', '.join(from_host) or 'nothing'}")
PY
echo "gpu_bundle: $dir is $(( size_kb / 1024 )) MiB; left to the GPU machine: ${external[*]:-nothing}"
echo "gpu_bundle: on the GPU machine: scripts/gpu_check.sh --prebuilt $dir"
