#!/usr/bin/env bash
# The GPU check of benchmarks/gpu_check.py in one call of the device tool (see its docstring).
#   bash benchmarks/gpu_check.sh --prepare      here, before the call: wheels into .whl/
#   bash benchmarks/gpu_check.sh --out "$OUT"   on the GPU host: install offline, then check
#   bash benchmarks/gpu_check.sh --dry-run      anywhere: the CPU dry run (nothing to install)
# Arguments other than --prepare go to gpu_check.py.
set -u
cd "$(dirname "$0")/.." || exit 1
if [ "${1:-}" = "--prepare" ]; then
    # what ../shared/device/prepare-wheels.sh does, also in a git worktree (.whl/ is in .gitignore)
    mkdir -p .whl/legacy && cp ../shared/wheels/*.whl .whl/ || exit 1
    git check-ignore -q .whl/legacy || { echo ".whl/ must be ignored by git"; exit 1; }
    # the last SpikingJelly with a CuPy LIFNode, installed apart (two spikingjelly wheels in
    # .whl/ would stop the install below)
    python3 -m pip download -q --no-deps --only-binary=:all: -d .whl/legacy \
        spikingjelly==0.0.0.0.14 || exit 1
    ls .whl .whl/legacy
    exit 0
fi
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1;
else
    export PYTHONPATH=$PWD
fi
if compgen -G ".whl/legacy/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_sj_legacy \
        .whl/legacy/*.whl || echo "the legacy SpikingJelly did not install: its case is skipped"
fi
export PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" benchmarks/gpu_check.py --legacy-site /tmp/site_sj_legacy "$@"
