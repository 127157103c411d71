#!/usr/bin/env bash
# Device calls after scripts/gpu_check.sh's build stage on the same (warm) machine, each step with its
# own time limit, logs in one tarball in $OUT:
#   build               pip install -e . (the README's build) unless pointops/_C is built: a call that
#                       finds a fresh machine (the warm one goes back after 30 s idle) builds first;
#                       FORCE_BUILD=1 rebuilds on a warm machine (its module may be another tree's)
#                       or, when .devbuild/ is carried with a module built from the same sources,
#                       unpacks that one (seconds instead of ~300 s); CLEAN_BUILD=1 removes build/
#                       first: after a file is reverted, a warm machine's incremental build can keep
#                       the object compiled from the changed file (the copied files keep this
#                       machine's modification times, and the clocks differ)
#   save-module         the built module into $OUT/devbuild/ (fetched, then carried as .devbuild/)
#   memcheck-particle   compute-sanitizer memcheck on the particle-sum tests
#   memcheck-probe      memcheck on the far-query probe and chunked-reduction tests, and the K = 1
#                       run batches' test (test_nearest_in_runs_of_every_length)
#   memcheck-ball       memcheck on the CUDA ball-query tests of the grid and of test_neighbors.py
#   racecheck-ball      racecheck on the crowded, cell-group, dense-cell and list ball tests (the warp
#                       ball query's shared buffers, the shared lists' bitmap and staging)
#   memcheck-tiles      memcheck on the same tests (the shared lists and the work list)
#   racecheck-list-sizes  racecheck on the list-size ball test alone (its 16384-point clouds take the
#                       per-cloud block sort, grid_keys_block_sort_kernel; ~1/4 of racecheck-ball)
#   racecheck-particle  racecheck on the particle sums' two-targets-per-thread test
#   tests-19            the CUDA tests of chamfer, chamfer_distance and voxelize (not the compile ones)
#   memcheck-19         memcheck on the CUDA tests of voxelize and chamfer_distance (MEMCHECK_19_S)
#   memcheck-chamfer    memcheck on the CUDA tests of chamfer, chamfer_distance and voxelize (the
#                       chamfer partials' single allocation, the loss kernel's and the look-back
#                       scan's warp helpers)
#   block-sort-bench    scripts/debug/block_sort_bench.cu (cub BlockRadixSort configurations, standalone)
#   ball-tests          the CUDA ball-query tests of the grid and of test_neighbors.py
#   check               grid_cuda_check.py check (random cases, grid vs brute bit for bit)
#   ball                grid_cuda_check.py ball (the issue's ball row, its kernels, grid vs brute)
#   ball-row            the same, the issue's row alone (three rounds, lists and warp per query)
#   chamfer             grid_cuda_check.py chamfer (uniform 1M, the real scans, two small batches;
#                       three rounds)
#   probe               grid_cuda_check.py probe (PROBE_CHAINS sweeps the latency bound's cost)
#   probe-lists         grid_cuda_check.py probe-lists (knn_points K > 1; LIST_KS, LIST_FACTORS)
#   lists-tests         the CUDA knn tests of test_grid_search.py / test_neighbors.py
#   memcheck-lists      memcheck on the K > 1 probe tests
#   racecheck-lists     racecheck on the probe's skip path (RACECHECK_LISTS_K: other K > 1 probe tests)
#   reduce              bench_strided.py's reduce rows, three runs
#   step                scripts/debug/chamfer_step_probe.py (the Chamfer training step)
#   overhead            benchmarks/bench_overhead.py --device cuda
#   ncu-source          ncu source counters (per CUDA line and SASS instruction) of the ball list kernel
#   profile-19          profile_particle_sum.py (also with each few-targets variant forced) and
#                       profile_voxelize.py (issue 19's small calls)
#   ncu-particle        ncu on one launch of the particle seed case's kernel
#   particle-sweep      particle_targets_sweep.py with 1 and 2 targets per thread forced and the rule,
#                       each in its own process, two rounds
#   memcheck-tests      memcheck on the test files in MEMCHECK_FILES, -k "$MEMCHECK_K" (default cuda);
#                       limit MEMCHECK_TESTS_S (default 250)
#   sass                cuobjdump -sass of the ball list kernel (float, D = 3)
#   routes              test_ball_query_grid_routes (which path the ball queries take)
#   grid-tests          the CUDA tests of test_grid_search.py and test_neighbors.py (GRID_TESTS_S)
#   tune                grid_cuda_check.py tune over TUNE_CROWDING (default 24,48,64,96,128,192), no ball
#   ncu-grid            ncu on one knn grid search kernel (KITTI moved vs scan) and one ball grid kernel
#   streams             chamfer's two directions side by side (chamfer_cuda.cu, run_side_by_side): its
#                       tests, the same under memcheck, reserved memory over many calls
#                       (chamfer_stream_memory.py), then the chamfer rounds
#   STEPS="memcheck-ball racecheck-ball ball" scripts/debug/device_steps.sh
# TESTS_19_S, MEMCHECK_CHAMFER_S and MEMCHECK_19_S set those steps' limits (defaults 150, 300, 250 s;
# the eighth session of 2026-11-27 gave memcheck-chamfer 380 s and memcheck-19 320 s, and both were
# cut at test_chamfer_distance.py's gradchecks).
# MEMCHECK_BALL_S sets memcheck-ball's limit (default 200 s; the whole set needs 10-12 minutes, most of
# it test_ball_query_gradcheck_and_gradgradcheck[grid-cuda]).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/burst}
mkdir -p "$OUT/logs"
export PYTHONUNBUFFERED=1
trap 'tar -czf "$OUT/burst_logs.tgz" -C "$OUT" logs' EXIT
STEPS=${STEPS:-"memcheck-ball racecheck-ball check ball"}
want() { [[ " $STEPS " == *" $1 "* ]]; }
# What the compiled module is built from (what a carried .devbuild module must match).
sources_hash() { find csrc setup.py pointops/_sources.py pointops/_toolchain.py -type f | LC_ALL=C sort \
  | xargs cat | sha1sum | cut -c1-16; }
step() {  # name, seconds, command...
  local name=$1 limit=$2
  shift 2
  echo "== $name ($(date +%T))"
  timeout "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
  echo "   rc=$? ($(date +%T))"
  tail -n "${TAILN:-4}" "$OUT/logs/$name.log"
}
sanitize() {  # name, seconds, tool (memcheck | racecheck), -k expression, pytest arguments (files)...
  local name=$1 limit=$2 tool=$3 expression=$4
  shift 4
  step "$name" "$limit" compute-sanitizer --tool "$tool" --error-exitcode 9 python -m pytest "$@" -q \
    -p no:cacheprovider -k "$expression"
}
suffix=$(python -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
if want build; then
  # Test for the built module's file, never `import pointops`: without pointops/_C the import
  # JIT-builds, and a JIT build killed by a time limit leaves torch's lock behind, on which every
  # later import on that machine waits for ever.
  rm -f "${TORCH_EXTENSIONS_DIR:-$HOME/.cache/torch_extensions}"/*/pointops_C_*/lock
  # .devbuild/ (git-ignored, carried): a module an earlier lease built (save-module), used only when
  # it was built from this tree's sources. A module left by an earlier call on a warm machine may
  # come from other sources (a build cut off by a time limit leaves the previous one): FORCE_BUILD=1
  # rebuilds whatever is there, as does a carried module that does not match.
  if [ -f .devbuild/module.tgz.00 ] && [ "$(cat .devbuild/sources.sha1)" = "$(sources_hash)" ] \
      && cat .devbuild/module.tgz.* | tar -xzf - -C pointops; then
    echo "== build: the module carried in .devbuild (sources $(cat .devbuild/sources.sha1))"
  elif [ -f "pointops/_C$suffix" ] && [ "${FORCE_BUILD:-0}" != 1 ] && [ ! -f .devbuild/module.tgz.00 ]; then
    echo "== build: pointops/_C$suffix is there (FORCE_BUILD=1 rebuilds it)"
  else
    [ -f .devbuild/module.tgz.00 ] && echo "== build: .devbuild's module is not this tree's: building"
    [ "${CLEAN_BUILD:-0}" = 1 ] && rm -rf build
    MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} \
      step build 420 python -m pip install --no-build-isolation --no-deps -e .
  fi
fi
# The module is imported from this tree (scripts too), also when no `pip install -e .` ran here.
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if want save-module; then
  # Brings the built module back (stripped, gzipped, in 15 MB pieces: $OUT's files are at most
  # 16 MiB each) for a later lease to carry as .devbuild/ instead of building for ~300 s.
  mkdir -p "$OUT/devbuild" /tmp/devbuild
  strip -g -o "/tmp/devbuild/_C$suffix" "pointops/_C$suffix"
  cp pointops/_build_config.py /tmp/devbuild/
  tar -czf - -C /tmp/devbuild . | split -b 15M -d - "$OUT/devbuild/module.tgz."
  sources_hash >"$OUT/devbuild/sources.sha1"
  echo "== save-module: $(ls -l "$OUT"/devbuild | tail -n +2 | awk '{print $5, $9}' | tr '\n' ' ')"
fi
if want memcheck-particle; then
  sanitize memcheck-particle 170 memcheck "cuda and not compile" tests/test_particle_sum.py
fi
if want tests-19; then
  TAILN=3 step tests-19 "${TESTS_19_S:-150}" python -m pytest tests/test_chamfer.py tests/test_chamfer_distance.py \
    tests/test_voxelize.py -q -p no:cacheprovider -k "cuda and not compile"
fi
if want memcheck-19; then
  sanitize memcheck-19 "${MEMCHECK_19_S:-250}" memcheck "cuda and not compile" tests/test_voxelize.py \
    tests/test_chamfer_distance.py
fi
if want memcheck-chamfer; then
  sanitize memcheck-chamfer "${MEMCHECK_CHAMFER_S:-300}" memcheck "cuda and not compile" tests/test_chamfer.py \
    tests/test_chamfer_distance.py tests/test_voxelize.py
fi
if want memcheck-probe; then
  sanitize memcheck-probe 220 memcheck "probe or chunked or runs_of_every_length" tests/test_grid_search.py \
    tests/test_strided.py
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
if want memcheck-ball; then
  sanitize memcheck-ball "${MEMCHECK_BALL_S:-200}" memcheck "ball and cuda and not compile" tests/test_grid_search.py \
    tests/test_neighbors.py
fi
if want racecheck-ball; then
  sanitize racecheck-ball "${RACECHECK_BALL_S:-200}" racecheck \
    "(cell_groups or crowded or dense_cells or list_sizes or lists_by_default) and cuda" tests/test_grid_search.py
fi
if want memcheck-tiles; then
  sanitize memcheck-tiles "${MEMCHECK_TILES_S:-200}" memcheck \
    "(cell_groups or crowded or dense_cells or list_sizes or lists_by_default) and cuda" tests/test_grid_search.py
fi
if want racecheck-list-sizes; then
  sanitize racecheck-list-sizes "${RACECHECK_LIST_SIZES_S:-200}" racecheck "list_sizes and cuda" \
    tests/test_grid_search.py
fi
if want racecheck-particle; then
  sanitize racecheck-particle 200 racecheck "two_targets" tests/test_particle_sum.py
fi
if want block-sort-bench; then
  TAILN=12 step block-sort-bench 120 bash -c "nvcc -O3 -std=c++17 -arch=sm_90 scripts/debug/block_sort_bench.cu \
    -o /tmp/block_sort_bench && /tmp/block_sort_bench"
fi
if want ball-tests; then
  TAILN=3 step ball-tests 200 python -m pytest tests/test_grid_search.py tests/test_neighbors.py -q \
    -p no:cacheprovider -k "ball and cuda and not compile"
fi
if want check; then
  TAILN=6 step check 200 python scripts/debug/grid_cuda_check.py check "${CHECK_CASES:-300}"
fi
if want ball; then
  TAILN=100 step ball 300 python scripts/debug/grid_cuda_check.py ball
fi
if want ball-row; then
  TAILN=30 step ball-row 120 env BALL_ROW_ONLY=1 python scripts/debug/grid_cuda_check.py ball
fi
if want chamfer; then
  TAILN=8 step chamfer 150 python scripts/debug/grid_cuda_check.py chamfer
fi
if want step; then
  TAILN=40 step step 150 python scripts/debug/chamfer_step_probe.py
fi
if want tune; then
  TAILN=40 step tune 200 env TUNE_BALL=0 TUNE_CROWDING="${TUNE_CROWDING:-24,48,64,96,128,192}" \
    python scripts/debug/grid_cuda_check.py tune
fi
if want ncu-grid; then
  for case in KITTI "ball K=64"; do
    name="ncu-$(echo "$case" | tr -c 'A-Za-z0-9' '_')"
    TAILN=60 step "$name" 150 ncu --kernel-name regex:"(knn|ball)_grid" --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section SchedulerStats python scripts/debug/grid_profile.py "$case"
  done
fi
if want streams; then
  TAILN=3 step streams-tests 120 python -m pytest tests/test_grid_search.py -q -p no:cacheprovider \
    -k "side_by_side or side_stream or probed_auto or (chamfer_grid_equals_brute and cuda)"
  TAILN=12 step streams-memory 60 python scripts/debug/chamfer_stream_memory.py
  TAILN=8 step chamfer 150 python scripts/debug/grid_cuda_check.py chamfer
  TAILN=3 sanitize streams-memcheck 200 memcheck "side_by_side or side_stream or probed_auto" tests/test_grid_search.py
fi
if want probe-lists; then
  # LIST_KS="16" LIST_FACTORS="1,2,4" sweeps the lists' factor (POINTOPS_GRID_PROBE_LIST_FACTOR)
  TAILN=60 step probe-lists "${PROBE_LISTS_S:-300}" env LIST_KS="${LIST_KS:-8,16,32}" LIST_FACTORS="${LIST_FACTORS:-}" \
    python scripts/debug/grid_cuda_check.py probe-lists
fi
if want lists-tests; then
  TAILN=3 step lists-tests 200 python -m pytest tests/test_grid_search.py tests/test_neighbors.py -q \
    -p no:cacheprovider -k "(lists or knn) and cuda and not compile"
fi
if want memcheck-lists; then
  TAILN=3 sanitize memcheck-lists "${MEMCHECK_LISTS_S:-250}" memcheck "lists and not graph" tests/test_grid_search.py
fi
if want racecheck-lists; then
  # ~1.5-2 minutes a test under racecheck: RACECHECK_LISTS_K selects a part of the 15 (default: the two
  # cases whose blob clouds the grid kernel skips; "lists and not graph" is the whole set)
  TAILN=3 sanitize racecheck-lists "${RACECHECK_LISTS_S:-250}" racecheck \
    "${RACECHECK_LISTS_K:-lists and not graph and (4-dtype0-default or 16-dtype1-default)}" tests/test_grid_search.py
fi
if want overhead; then
  TAILN=40 step overhead 200 python benchmarks/bench_overhead.py --device cuda
fi
if want ncu-source; then
  # Per source line / SASS instruction of the ball query's list kernel (issue 18's row): instructions
  # executed and warp-stall samples, as CSV (columns "Instructions Executed" and "Warp Stall Sampling
  # (All Samples)"; no script here summarises them).
  TAILN=5 step ncu-source-run 200 ncu --kernel-name regex:"ball_grid_tile" --launch-skip 2 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section InstructionStats --import-source yes \
    -f -o "$OUT/logs/tile" python scripts/debug/grid_profile.py "ball K=64"
  TAILN=2 step ncu-source-cuda 60 ncu -i "$OUT/logs/tile.ncu-rep" --page source --csv --print-source cuda
  TAILN=2 step ncu-source-sass 60 ncu -i "$OUT/logs/tile.ncu-rep" --page source --csv --print-source sass
fi
if want profile-19; then
  # Issue 19's small GPU calls: the particle seed case and nuScenes voxelize, host vs kernels.
  TAILN=30 step profile-particle 90 python scripts/debug/profile_particle_sum.py
  # the few-targets variants forced (one and two targets per thread), each in its own process
  for q in 1 2; do
    TAILN=1 step "profile-particle-q$q" 60 env POINTOPS_PARTICLE_FEW_TARGETS_PER_THREAD=$q \
      python scripts/debug/profile_particle_sum.py
    grep "^seed" "$OUT/logs/profile-particle-q$q.log"
  done
  TAILN=40 step profile-voxelize 90 python scripts/debug/profile_voxelize.py
fi
if want particle-sweep; then
  # Targets per thread of the few-targets particle kernels: each choice in its own process, two rounds.
  for round in 1 2; do
    for q in default 1 2; do
      TAILN=0 step "particle-sweep-$round-q$q" 120 env POINTOPS_PARTICLE_FEW_TARGETS_PER_THREAD=$q \
        python scripts/debug/particle_targets_sweep.py
      grep -h "^q=\|Error" "$OUT/logs/particle-sweep-$round-q$q.log"
    done
  done
fi
if want memcheck-tests; then
  # memcheck on the test files in MEMCHECK_FILES (space-separated), selected by -k "$MEMCHECK_K".
  # shellcheck disable=SC2086
  TAILN=6 sanitize memcheck-tests "${MEMCHECK_TESTS_S:-250}" memcheck "${MEMCHECK_K:-cuda}" -rs $MEMCHECK_FILES
fi
if want ncu-particle; then
  # One launch of the seed case's kernel (480,000 targets x 50 sources): throughput, occupancy, stalls.
  TAILN=80 step ncu-particle 120 ncu --kernel-name regex:particle_sum_d3 --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
    --section WarpStateStats python scripts/debug/profile_particle_sum.py seed
fi
if want sass; then
  # The SASS of the ball query's list kernel (float, D = 3), for reading its scan loop.
  TAILN=1 step sass 60 cuobjdump -sass -fun _ZN8pointops9grid_cuda21ball_grid_tile_kernelIfLi3EEEvNS0_10SearchArgsIT_XT0_EEE \
    "pointops/_C$suffix"
fi
if want routes; then
  TAILN=3 step routes 120 python -m pytest tests/test_grid_search.py -q -p no:cacheprovider -k "routes"
fi
if want grid-tests; then
  # Every CUDA test of the grid and neighbourhood files (knn, chamfer and ball paths over the grid).
  TAILN=3 step grid-tests "${GRID_TESTS_S:-200}" python -m pytest tests/test_grid_search.py tests/test_neighbors.py -q \
    -p no:cacheprovider -k "cuda and not compile" -x
fi
