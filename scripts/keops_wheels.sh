#!/usr/bin/env bash
# Fetch KeOps (pykeops + keopscore) as wheels into <repo>/.whl, for the GPU machine, which cannot
# download anything. Run here, from anywhere in the repo:  bash scripts/keops_wheels.sh
#
# KeOps 2.3 is published as sdists only, both pure Python (the CUDA kernels are generated and
# compiled at run time with NVRTC), so the wheels are built here as py3-none-any wheels. Their
# other requirements, numpy and pybind11, are already in the GPU image (as is torch).
# .whl/ is ignored by .gitignore (/.whl/). Size: about 0.3 MB.
#
# On the GPU machine (carry [".whl"]), start the command with:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit;
# and then e.g.  python3 benchmarks/run.py --only particle_sum
set -euo pipefail

VERSION="${KEOPS_VERSION:-2.3}"
repo="$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
dest="$repo/.whl"
mkdir -p "$dest"
rm -f "$dest"/pykeops-*.whl "$dest"/keopscore-*.whl   # keep one version of each

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# A binary wheel first (none exists for 2.3; a later release might ship a py3-none-any wheel).
if ! python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$tmp/wheels" "pykeops==$VERSION" "keopscore==$VERSION" 2>/dev/null; then
    rm -rf "$tmp/wheels"
    python3 -m pip download -q --no-deps --no-binary=:all: -d "$tmp/sdists" \
        "pykeops==$VERSION" "keopscore==$VERSION"
    # setuptools builds them (setup.py only); no build isolation, so nothing else is fetched.
    python3 -m pip wheel -q --no-deps --no-build-isolation -w "$tmp/wheels" "$tmp"/sdists/*.tar.gz
fi
cp "$tmp"/wheels/*.whl "$dest"/

for whl in "$dest"/pykeops-*.whl "$dest"/keopscore-*.whl; do
    echo "$(basename "$whl") $(du -k "$whl" | cut -f1) KiB"
    unzip -p "$whl" '*/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' | sed 's/^/    /' || true
done
du -sh "$dest"
