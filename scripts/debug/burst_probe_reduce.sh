#!/usr/bin/env bash
# A device call after scripts/gpu_check.sh's build stage on the same (warm) machine: memcheck of the
# particle-sum tests (the routing of 3fd9e87), of the far-query probe and the chunked-reduction
# tests; the probe's timings (grid_cuda_check.py probe); the strided reduce rows, three runs. Logs:
# one tarball in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/burst}
mkdir -p "$OUT/logs"
export PYTHONUNBUFFERED=1
trap 'tar -czf "$OUT/burst_logs.tgz" -C "$OUT" logs' EXIT
STEPS=${STEPS:-"memcheck-particle memcheck-probe probe reduce"}
want() { [[ " $STEPS " == *" $1 "* ]]; }
step() {  # name, seconds, command...
  local name=$1 limit=$2
  shift 2
  echo "== $name ($(date +%T))"
  timeout "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
  echo "   rc=$? ($(date +%T))"
  tail -n "${TAILN:-4}" "$OUT/logs/$name.log"
}
if want memcheck-particle; then
  step memcheck-particle 170 compute-sanitizer --tool memcheck --error-exitcode 9 python -m pytest \
    tests/test_particle_sum.py -q -p no:cacheprovider -k "cuda and not compile"
fi
if want memcheck-probe; then
  step memcheck-probe 150 compute-sanitizer --tool memcheck --error-exitcode 9 python -m pytest \
    tests/test_grid_search.py tests/test_strided.py -q -p no:cacheprovider -k "probe or chunked"
fi
if want probe; then
  # PROBE_CHAINS="0,1e6,4e6,1.6e7" sweeps the latency bound's cost (POINTOPS_GRID_PROBE_CHAIN)
  TAILN=45 step probe 300 env PROBE_CHAINS="${PROBE_CHAINS:-}" python scripts/debug/grid_cuda_check.py probe
fi
if want reduce; then
  for round in 1 2 3; do
    TAILN=0 step "reduce-$round" 90 python benchmarks/bench_strided.py --device cuda --parts reduce
    grep "reduce" "$OUT/logs/reduce-$round.log" | grep cuda | tail -5
  done
fi
