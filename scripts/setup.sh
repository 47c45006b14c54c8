#!/usr/bin/env bash
# Create .venv with PyTorch and this package (editable, with the test extras: pytest, hypothesis, ruff, and the
# audio extra so the audio tests run).
#
# torch is installed first and pinned only when absent, so pip never swaps in a multi-GB CUDA build on a CPU
# machine: set TORCH_SPEC (default torch==2.13.0) or TORCH_INDEX_URL (e.g. https://download.pytorch.org/whl/cpu)
# to choose the build. An existing .venv with torch is reused as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "installing ${TORCH_SPEC:-torch==2.13.0} ..."
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    "$PY" -m pip install -q --index-url "$TORCH_INDEX_URL" "${TORCH_SPEC:-torch==2.13.0}"
  else
    "$PY" -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
  fi
fi
echo "installing compressive-transformer ..."
"$PY" -m pip install -q -e ".[dev,audio]"
"$PY" -c "import torch, compressive_transformer as ct; print(f'ready: torch {torch.__version__}, compressive-transformer {ct.__version__}')"
