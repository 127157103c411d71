#!/usr/bin/env bash
# One device call for the grid and Chamfer families (issues 18, 19) short of the full build:
# family_probe.py JIT-builds chamfer + grid + neighbors only, then the bitwise checks, the tuning
# sweeps, the timings, the Chamfer step probe and the CUDA tests of those families, each stage
# with its own time limit and its log in $OUT/logs (one tarball at the end). STAGES picks stages (default: all, in this order).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
OUT=${OUT:-/tmp/grid_gpu_session}
# The device tool brings back at most 8 files from $OUT: the logs go to $OUT/logs and leave as one
# tarball ($OUT/grid_logs_<time>.tgz) when the script ends.
LOGS="$OUT/logs"
mkdir -p "$LOGS"
trap 'tar -czf "$OUT/grid_logs_$(date +%H%M%S).tgz" -C "$OUT" logs && rm -rf "$LOGS"' EXIT
if [ ! -e ../shared/data ] && [ -d .data ]; then mkdir -p ../shared && ln -s "$PWD/.data" ../shared/data; fi
if [ "${BUILD:-jit}" = installed ]; then
  # pointops is already built and installed (scripts/gpu_check.sh's build stage on this machine).
  run="python"
  run_pytest="python -m pytest -p no:cacheprovider"
else
  probe="python scripts/debug/family_probe.py chamfer,grid,neighbors"
  run="$probe run"
  run_pytest="$probe pytest"
  # A JIT build killed half-way (a stage's timeout, the call's limit) leaves torch's lock file, and
  # every later load on this machine would wait on it for ever.
  rm -f "$HOME"/.cache/torch_extensions/*/pointops_C_cuda/lock
  # The build first, with no stage limit (321 s on the H100 machine): a timeout inside the build is
  # what strands the lock.
  echo "== build ($(date +%T))"
  POINTOPS_JIT_VERBOSE=1 $probe build 2>&1 | tee "$LOGS/build.log" | tail -n 3
fi
STAGES=${STAGES:-"check tune time step tests"}  # also: racecheck memcheck profile ncu auto; they run in file order
stage() {  # name, seconds, command...
  local name=$1 limit=$2
  shift 2
  case " $STAGES " in *" $name "*) ;; *) return 0 ;; esac
  echo "== $name ($(date +%T))"
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
  echo "   rc=$? ($(date +%T))"
  tail -n 25 "$LOGS/$name.log"
}
stage racecheck 200 compute-sanitizer --tool racecheck --kernel-name kns=ball_grid_warp --error-exitcode 1 \
  $run scripts/debug/grid_cuda_check.py check 3
stage memcheck 200 compute-sanitizer --tool memcheck --error-exitcode 1 $run scripts/debug/grid_cuda_check.py check 3
stage check 420 $run scripts/debug/grid_cuda_check.py check ${CHECK_N:-40}
stage tests 240 $run_pytest -x -q -m cuda tests/test_grid_search.py tests/test_neighbors.py tests/test_chamfer_distance.py tests/test_chamfer.py
stage profile 420 $run scripts/debug/grid_profile.py
stage ncu 200 ncu --kernel-name regex:ball_grid_warp --launch-skip 2 --launch-count 1 --set full \
  --import-source yes -f -o "$LOGS/ball_warp" $run scripts/debug/grid_profile.py ball
case " $STAGES " in *" ncu "*)  # the report's pages as text: per-line (SASS) stall samples, the details
  ncu -i "$LOGS/ball_warp.ncu-rep" --page details >"$LOGS/ncu_details.txt" 2>&1
  ncu -i "$LOGS/ball_warp.ncu-rep" --page source --csv --print-source sass >"$LOGS/ncu_source_sass.csv" 2>&1
  head -c 20000 "$LOGS/ncu_details.txt" ;;
esac
stage tune 240 $run scripts/debug/grid_cuda_check.py tune
stage auto 240 $run scripts/debug/grid_cuda_check.py auto
stage time 150 $run scripts/debug/grid_cuda_check.py time
stage step 90 $run scripts/debug/chamfer_step_probe.py
