#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh), builds (Release) into build/ and runs every test with
# ctest: the unit suites and the distributed suites under mpirun with 1-4 ranks. Works from any
# directory. Extra arguments go to the CMake configure step (e.g. -DZERO_CUDA=OFF).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
launcher=()
if [ ! -f "$root/build/CMakeCache.txt" ] && command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@"
cmake --build "$root/build" -j"$(nproc)"
ctest --test-dir "$root/build" --output-on-failure -j"$(nproc)"
