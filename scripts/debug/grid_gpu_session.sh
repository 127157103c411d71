#!/usr/bin/env bash
# One device call for the grid and Chamfer families (issues 18, 19) short of the full build:
# family_probe.py JIT-builds chamfer + grid + neighbors only, then the bitwise checks, the tuning
# sweeps, the timings, the Chamfer step probe and the CUDA tests of those families, each stage
# with its own time limit and its log in $OUT. STAGES picks stages (default: all, in this order).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
OUT=${OUT:-/tmp/grid_gpu_session}
mkdir -p "$OUT"
if [ ! -e ../shared/data ] && [ -d .data ]; then mkdir -p ../shared && ln -s "$PWD/.data" ../shared/data; fi
probe="python scripts/debug/family_probe.py chamfer,grid,neighbors"
# A JIT build killed half-way (a stage's timeout, the call's limit) leaves torch's lock file, and
# every later load on this machine would wait on it for ever.
rm -f "$HOME"/.cache/torch_extensions/*/pointops_C_cuda/lock
# The build first, with no stage limit (321 s on the H100 machine): a timeout inside the build is
# what strands the lock.
echo "== build ($(date +%T))"
POINTOPS_JIT_VERBOSE=1 $probe build 2>&1 | tee "$OUT/build.log" | tail -n 3
STAGES=${STAGES:-"check tune time step tests"}  # also: profile ncu racecheck memcheck
stage() {  # name, seconds, command...
  local name=$1 limit=$2
  shift 2
  case " $STAGES " in *" $name "*) ;; *) return 0 ;; esac
  echo "== $name ($(date +%T))"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "   rc=$? ($(date +%T))"
  tail -n 25 "$OUT/$name.log"
}
stage profile 420 $probe run scripts/debug/grid_profile.py
stage check 420 $probe run scripts/debug/grid_cuda_check.py check 40
stage tune 240 $probe run scripts/debug/grid_cuda_check.py tune
stage time 150 $probe run scripts/debug/grid_cuda_check.py time
stage step 90 $probe run scripts/debug/chamfer_step_probe.py
stage ncu 120 ncu --kernel-name regex:ball_grid_warp --launch-skip 2 --launch-count 1 --section SpeedOfLight \
  --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
  $probe run scripts/debug/grid_profile.py ball
stage racecheck 200 compute-sanitizer --tool racecheck --kernel-name regex:ball_grid_warp --error-exitcode 1 \
  $probe run scripts/debug/grid_cuda_check.py check 3
stage memcheck 200 compute-sanitizer --tool memcheck --error-exitcode 1 $probe run scripts/debug/grid_cuda_check.py check 3
stage tests 240 $probe pytest -x -q -m cuda tests/test_grid_search.py tests/test_neighbors.py tests/test_chamfer_distance.py tests/test_chamfer.py
