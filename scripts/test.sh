#!/usr/bin/env bash
# Builds (Release) into build/ and runs every test with ctest: unit suites and the distributed suites
# under mpirun with 1-4 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)"
