#!/usr/bin/env bash
# Create .venv with PyTorch and this package (editable, with the test extras: pytest, hypothesis, ruff).
#
#   bash scripts/setup.sh                 # the environment the README's commands use
#   bash scripts/setup.sh audio rl        # ... plus optional extras (audio, rl, lm-eval, transfo-xl, tensorboard)
#   bash scripts/setup.sh all             # ... plus every optional extra (what CI installs)
#
# torch is installed first and pinned only when absent, so pip never swaps in a multi-GB CUDA build on a CPU
# machine: set TORCH_SPEC (default torch==2.13.0) or TORCH_INDEX_URL (e.g. https://download.pytorch.org/whl/cpu)
# to choose the build. An existing .venv with torch is reused as it is, and extras are installed against the torch
# it holds (a constraint keeps any extra from replacing it).
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

EXTRAS=dev
for extra in "$@"; do
  if [ "$extra" = all ]; then
    extra=$("$PY" scripts/extras.py)
  elif ! "$PY" scripts/extras.py | tr ',' '\n' | grep -qx "$extra"; then
    echo "setup.sh: unknown extra '$extra'; choose from: all, $("$PY" scripts/extras.py | sed 's/,/, /g')" >&2
    exit 2
  fi
  EXTRAS="$EXTRAS,$extra"
done

echo "installing compressive-transformer[$EXTRAS] ..."
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
# the installed torch's version read from its metadata: importing torch here, before numpy is installed, would warn
"$PY" -c "from importlib.metadata import version; print('torch==' + version('torch').split('+')[0])" > "$CONSTRAINTS"
"$PY" -m pip install -q -c "$CONSTRAINTS" -e ".[$EXTRAS]"
"$PY" -c "import torch, compressive_transformer as ct; print(f'ready: torch {torch.__version__}, compressive-transformer {ct.__version__}')"
