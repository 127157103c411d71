#!/usr/bin/env bash
# The wheel works on its own: build the sdist and the wheel, check what each contains, install the
# wheel into a fresh virtual environment that has only torch and numpy, and from a directory
# outside the checkout run `python -m pointops info`, scripts/wheel_smoke.py (every op family
# against a brute-force reference) and the torch-mismatch refusal. CPU; CI runs it from .ci/run.
#
#   scripts/check_wheel.sh
#   DIST=dir    keep the built wheel and sdist in dir (default: a temp dir, removed at the end)
#   KEEP=1      keep the temp dir (the venv) for a look
#   FROM_SDIST=1  build the wheel from the sdist instead of the checkout: proves the sdist builds,
#               at the price of a full compile
#   PYTHON=...  the interpreter whose torch builds the wheel (default python, as in the README)
#
# The wheel is compiled in build/temp.*, the directory `pip install -e .` also uses (setup.py), so
# after an editable build it only relinks. The venv gets the exact torch the wheel was built
# against, through the machine's pip configuration (same index / find-links as the outer pip).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PYTHON=${PYTHON:-python}
work=$(mktemp -d)
trap '[ "${KEEP:-0}" = 1 ] && echo "kept $work" || rm -rf "$work"' EXIT
dist=${DIST:-$work/dist}
mkdir -p "$dist"
fail() { echo "check_wheel: FAIL: $*" >&2; exit 1; }
step() { echo; echo "== $* ($(( SECONDS ))s)"; }

step "sdist"
# The PEP 517 call that `python -m build --sdist --no-isolation` makes, without needing `build`.
"$PYTHON" -c 'import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))' \
  "$dist" >"$work/sdist.log" 2>&1 || { tail -40 "$work/sdist.log"; fail "building the sdist failed"; }
sdist=$dist/$(tail -1 "$work/sdist.log")
[ -f "$sdist" ] || { tail -40 "$work/sdist.log"; fail "no sdist at $sdist"; }
tar -tzf "$sdist" | sed 's|^[^/]*/||' | grep -v '/$' | sort >"$work/sdist.txt"
# Everything a build from the sdist reads (the package, csrc/ sources and headers, the build files),
# and the tests.
needed=(csrc pointops tests setup.py pyproject.toml MANIFEST.in README.md LICENSE requirements-test.txt)
if git rev-parse --git-dir >/dev/null 2>&1; then
  git ls-files --cached --others --exclude-standard "${needed[@]}" | sort >"$work/needed.txt"
else
  find "${needed[@]}" -type f \
    ! -name '*.so' ! -name '*.pyc' ! -name _build_config.py | sort >"$work/needed.txt"
fi
missing=$(comm -23 "$work/needed.txt" "$work/sdist.txt")
[ -z "$missing" ] || fail "the sdist lacks: $missing"
leaked=$(grep -E '(\.so|_build_config\.py)$' "$work/sdist.txt" || true)
[ -z "$leaked" ] || fail "the sdist carries build outputs: $leaked"
echo "$(basename "$sdist"): $(wc -l <"$work/sdist.txt") files, all $(wc -l <"$work/needed.txt") needed ones" \
  "($(grep -c '^csrc/' "$work/sdist.txt") under csrc/)"

step "wheel"
rm -rf build/lib.*  # stale modules there would go into the wheel; the objects in build/temp.* stay
start=$SECONDS
source_to_build=.
[ "${FROM_SDIST:-0}" = 1 ] && source_to_build=$sdist
"$PYTHON" -m pip wheel -v --no-build-isolation --no-deps -w "$dist" "$source_to_build" >"$work/wheel.log" 2>&1 \
  || { tail -40 "$work/wheel.log"; fail "pip wheel $source_to_build failed"; }
grep -oE "pointops: (building|recorded) .*" "$work/wheel.log" || true
wheel=$(ls -t "$dist"/pointops-*.whl | head -1)
echo "built $(basename "$wheel") from $source_to_build in $(( SECONDS - start ))s"
"$PYTHON" -m zipfile -l "$wheel" | awk 'NR > 1 {print $1}' | sort >"$work/wheel.txt"
for f in pointops/__init__.py pointops/_build_config.py pointops/_build_record.py pointops/demo/__init__.py; do
  grep -qx "$f" "$work/wheel.txt" || fail "the wheel lacks $f"
done
grep -qE '^pointops/_C\..*(so|pyd)$' "$work/wheel.txt" || fail "the wheel lacks the compiled pointops/_C"
! grep -q '^csrc/' "$work/wheel.txt" || fail "the wheel carries csrc/"
"$PYTHON" -c 'import sys, zipfile; print(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]).decode())' \
  "$wheel" pointops/_build_config.py | grep BUILT_AGAINST

step "fresh venv: torch, numpy, the wheel"
torch_version=$("$PYTHON" -c 'import torch; print(torch.__version__)')
"$PYTHON" -m venv "$work/venv"  # no --system-site-packages: only what is installed below
venv_python=$work/venv/bin/python
"$venv_python" -m pip install -q "torch==$torch_version" numpy "$wheel" \
  || fail "installing torch==$torch_version, numpy and the wheel into a fresh venv failed"
"$venv_python" -m pip list 2>/dev/null | grep -iE '^(torch|numpy|pointops|ninja) '

step "smoke test from outside the checkout"
mkdir "$work/run" && cp scripts/wheel_smoke.py "$work/run/"
cd "$work/run"  # the checkout is not on sys.path here
info=$("$venv_python" -m pointops info) || fail "python -m pointops info failed"
echo "$info"
grep -q "built against:  torch $torch_version" <<<"$info" || fail "info does not name the build's torch"
"$venv_python" wheel_smoke.py "$REPO" || fail "the smoke test failed"

step "a build record for another torch is refused with the reason"
package=$("$venv_python" -c 'import importlib.util as u; print(u.find_spec("pointops").submodule_search_locations[0])')
config=$package/_build_config.py
sed -i "s/'torch_version': '[^']*'/'torch_version': '1.0.0'/" "$config"
if out=$("$venv_python" -c 'import pointops' 2>&1); then fail "a record for torch 1.0.0 was accepted"; fi
grep -q "pointops was built against torch 1.0.0 but torch $torch_version is installed" <<<"$out" \
  || { echo "$out"; fail "the mismatch message is missing"; }
echo "refused: $(grep -o 'pointops was built against[^(]*' <<<"$out" | head -1)"

echo
echo "check_wheel: OK ($(basename "$wheel"), $(basename "$sdist"), ${SECONDS}s)"
