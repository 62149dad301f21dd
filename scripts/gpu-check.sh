#!/usr/bin/env bash
# Run the GPU tests (pytest -m gpu) on a machine with an NVIDIA GPU.
#
#   scripts/gpu-check.sh                 # uses .venv, installing gpulease from PyPI if needed
#   WHEELS=/path/to/wheels scripts/gpu-check.sh
#                                        # offline: pip install --no-index --find-links $WHEELS
#                                        # (the folder must hold every dependency of '.[test]',
#                                        #  and setuptools + wheel for the editable build)
#   VENV=/tmp/venv PYTHON=python3.12 scripts/gpu-check.sh
#
# Read only on GPU state: it lists GPUs and runs tests that only read NVML and
# nvidia-smi. Nothing here changes MIG mode, clocks or any other GPU setting.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
TIMEOUT="${TIMEOUT:-300}"   # the whole test run, in seconds

if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
if [ -n "${WHEELS:-}" ]; then
  echo "== installing gpulease from $WHEELS (no index)"
  "$VENV/bin/python" -m pip install --quiet --no-index --find-links "$WHEELS" -e '.[test]'
elif "$VENV/bin/python" -c 'import gpulease.host.nvml, pytest' 2>/dev/null; then
  echo "== gpulease already installed in $VENV"
else
  echo "== installing gpulease from PyPI"
  "$VENV/bin/python" -m pip install --quiet -e '.[test]'
fi

echo "== GPUs (nvidia-smi -L)"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -L
  echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1)"
else
  echo "nvidia-smi not found: the GPU tests will skip"
fi

echo "== pytest -m gpu (timeout ${TIMEOUT}s)"
exec timeout --kill-after=10 "$TIMEOUT" "$VENV/bin/python" -m pytest -m gpu -v -rs
