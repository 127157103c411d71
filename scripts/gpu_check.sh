#!/usr/bin/env bash
# The one command the GPU machine runs: build, CUDA tests, compute-sanitizer, the peers' own test
# suites, benchmarks, multi-GPU (DDP example timing, second-GPU tests). Logs land in $OUT (the device
# tool brings them back).
#   STAGES="build test sanitize peers bench ddp" scripts/gpu_check.sh     (default: all six)
#   PYTEST_TARGETS=tests/test_chamfer.py PYTEST_K="graph" BENCH_ARGS="--only chamfer" ...
#   PYTEST_MARK="cuda"   (default: the tests that need a GPU, every one of them, as tests/conftest.py
#                         marks them; CI on the CPU runs the rest. PYTEST_MARK="" runs everything)
#   SANITIZE_TESTS=tests/test_particle_sum.py   (the tests run under memcheck; "none" skips them)
#   SANITIZE_CASES="neighbors chamfer"   (families of scripts/sanitize_cases.py; default: all)
#   DDP_ARGS="--time --steps 120 ..."   (examples/ddp_chamfer.py's arguments in the ddp stage)
# Data for the data tests travels as .data/ (a copy of ../shared/data, git-ignored). The peers'
# CUDA sources (PyTorch3D, torch_cluster) travel as .peers/ (git-ignored; benchmarks/peers.py): when
# present and the bench stage runs, they are built in the background while pointops builds.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/pointops-out}
mkdir -p "$OUT"
STAGES=${STAGES:-build test sanitize peers bench ddp}
export MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} PYTHONUNBUFFERED=1
# The GPU image's Python was built with /opt/gcc/bin/g++, which links libstdc++ statically into
# every extension: a second libstdc++ copy whose locale facets are never initialised, so the first
# integer formatted into an error message segfaulted. setup.py and the JIT loader now probe the
# toolchain and switch to the system g++ themselves (pointops/_toolchain.py): the build below is
# the README's. LEGACY_SYSTEM_GXX=1 forces the old explicit override.
if [ "${LEGACY_SYSTEM_GXX:-0}" = 1 ] && [ -x /usr/bin/g++ ]; then
  export CC=/usr/bin/gcc CXX=/usr/bin/g++ LDSHARED="/usr/bin/g++ -shared"
fi
status=0
stage() { [[ " $STAGES " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv | tee "$OUT/gpu.txt"

peers_pid=""
if stage bench && [ -d .peers ]; then
  (cd benchmarks && python -c "import peers; print('peers built:', peers.load_pytorch3d() is not None, \
    peers.load_torch_cluster() is not None)") >"$OUT/peers-build.log" 2>&1 &
  peers_pid=$!
fi

stage_start=$(date +%s)
elapsed() { echo "[$1 done at $(( $(date +%s) - stage_start )) s]"; }
if stage build; then
  start=$(date +%s)
  if ! python -m pip install -v --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1; then
    tail -60 "$OUT/build.log"; echo "BUILD FAILED"; exit 1
  fi
  echo "build: $(( $(date +%s) - start )) s"
  grep "pointops:" "$OUT/build.log" | head -5
  ldd pointops/_C*.so | grep -q libstdc++ || echo "WARNING: pointops/_C links libstdc++ statically"
  # Error paths first, each in a child process: a crash here means the toolchain fix failed.
  python -m pytest tests/test_error_paths.py -q -p no:cacheprovider 2>&1 | tail -3
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "ERROR PATHS CRASH OR FAIL"; exit 1; }
  python -c "import pointops, torch; print(pointops.build_info(), torch.cuda.get_device_name())"
fi

if stage test; then
  python -m pytest ${PYTEST_TARGETS:-tests} -q -ra -p no:cacheprovider -m "${PYTEST_MARK-cuda}" -k "${PYTEST_K:-}" \
    --durations=15 2>&1 | tee "$OUT/pytest.log" | tail -60
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  elapsed test
fi

if stage sanitize; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool "$tool" --error-exitcode 9 python scripts/sanitize_cases.py ${SANITIZE_CASES:-} >"$OUT/sanitize-$tool.log" 2>&1
    rc=$?
    echo "compute-sanitizer $tool: rc=$rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-$tool.log" | tail -1)"
    [ $rc -eq 0 ] || { status=1; tail -30 "$OUT/sanitize-$tool.log"; }
  done
  elapsed "sanitize cases"
  # memcheck over the CUDA tests themselves (compile tests left out: slow under the sanitizer)
  if [ "${SANITIZE_TESTS:-tests}" != none ]; then
    compute-sanitizer --tool memcheck --error-exitcode 9 python -m pytest ${SANITIZE_TESTS:-tests} -q \
      -p no:cacheprovider -k "cuda and not compile" >"$OUT/sanitize-tests.log" 2>&1
    rc=$?
    echo "compute-sanitizer memcheck on CUDA tests: rc=$rc, $(grep -E 'ERROR SUMMARY' "$OUT/sanitize-tests.log" | tail -1) $(grep -E 'passed|failed' "$OUT/sanitize-tests.log" | tail -1)"
    [ $rc -eq 0 ] || { status=1; tail -30 "$OUT/sanitize-tests.log"; }
  fi
fi

# PyTorch3D's and torch_cluster's own neighbour tests with pointops as the implementation (their
# CUDA variants run here). Their extra Python packages travel as wheels in .whl/ when missing.
if stage peers; then
  ls .whl/*.whl >/dev/null 2>&1 && python -m pip install -q --no-deps --no-index .whl/*.whl >/dev/null 2>&1
  python scripts/peer_suites.py >"$OUT/peer-suites.log" 2>&1
  rc=$?
  sed -n '/===== summary/,$p' "$OUT/peer-suites.log"
  [ $rc -eq 0 ] || status=1
  elapsed peers
fi

if stage bench; then
  if [ -n "$peers_pid" ]; then wait "$peers_pid"; tail -2 "$OUT/peers-build.log"; fi
  python benchmarks/run.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  cp benchmarks/latest.md "$OUT/" 2>/dev/null
fi

# Multi-GPU: the DDP example timed on 1 and 2 GPUs (NCCL, the same global batch), then the
# second-GPU device-guard tests. Needs >= 2 GPUs; on fewer it says so and passes.
if stage ddp; then
  gpus=$(python -c "import torch; print(torch.cuda.device_count())")
  if [ "${gpus:-0}" -lt 2 ]; then
    echo "ddp: skipped, needs 2 GPUs (found ${gpus:-none})"
  else
    export NCCL_NVLS_ENABLE=0  # NVLink multicast must stay off on our GPU host
    for nproc in 1 2; do
      python -m torch.distributed.run --standalone --nproc_per_node=$nproc examples/ddp_chamfer.py \
        ${DDP_ARGS:---time --steps 120 --warmup 20 --batch 128 --points 8192 --hidden 512} >"$OUT/ddp-${nproc}gpu.log" 2>&1
      rc=$?
      echo "ddp on $nproc GPU(s): rc=$rc, $(grep -E '^step time' "$OUT/ddp-${nproc}gpu.log")"
      [ $rc -eq 0 ] || { status=1; tail -30 "$OUT/ddp-${nproc}gpu.log"; }
    done
    python -m pytest tests/test_multi_gpu.py -q -ra -p no:cacheprovider 2>&1 | tee "$OUT/pytest-multi-gpu.log" | tail -15
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  fi
  elapsed ddp
fi
exit $status
