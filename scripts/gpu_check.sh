#!/usr/bin/env bash
# The GPU check: checks a GPU machine against what the bundle needs, then runs every GPU test, a training
# run that must learn, ZeRO-2/3 on the GPU against the CPU, the distributed tests and the benchmarks within
# a time budget, and writes one JSON file whose "status" is "ok" only when every step ran and passed, and a
# tar of every step's logs and reports ($OUT/gpu_check_evidence.tar.gz when OUT is set; scripts/gpu_check.py
# has the details, docs/gpu.md the plan and the statuses).
#
#   scripts/gpu_check.sh --prebuilt DIR [--out FILE]   on the GPU machine, with a bundle
#   scripts/gpu_check.sh [--out FILE]                  building here (needs every dependency; slow)
#   scripts/gpu_check.sh --dry-run [--prebuilt DIR]    print the plan: steps, order, time limits
#   scripts/gpu_check.sh --prebuilt DIR --steps A,B    re-run only the named steps
#   scripts/gpu_check.sh --bundle DIR                  on a build machine: scripts/gpu_bundle.sh DIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = --bundle ]; then
  [ $# -eq 2 ] || { echo "usage: scripts/gpu_check.sh --bundle DIR" >&2; exit 2; }
  exec "$here/gpu_bundle.sh" "$2"
fi
command -v python3 >/dev/null || { echo "gpu_check: python3 is needed (it runs the check and writes the JSON)" >&2; exit 1; }
exec python3 "$here/gpu_check.py" "$@"
