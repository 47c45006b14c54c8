#!/usr/bin/env bash
# Creates benchmarks/.venv-peers: a venv that reuses the system torch (--system-site-packages; torch==2.13.0 if none) and holds the peer
# implementations the benchmark compares against. Every peer is installed with --no-deps so pip can never pull
# another torch; their small pure-Python dependencies are listed explicitly. Safe to re-run.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/.venv-peers"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv --system-site-packages "$VENV"
fi
VPY="$VENV/bin/python"
if ! "$VPY" -c 'import torch' 2>/dev/null; then  # no system torch: the CPU wheel first, so nothing pulls a CUDA build
  "$VPY" -m pip install --disable-pip-version-check "torch==2.13.0" numpy pyyaml
fi
TORCH_BEFORE="$("$VPY" -c 'import torch; print(torch.__version__)')"
echo "torch from the system site-packages: $TORCH_BEFORE"

# 1. lucidrains/compressive-transformer-pytorch 0.4.0 (needs mogrifier, which needs einops).
"$VPY" -m pip install --no-deps --disable-pip-version-check \
  "compressive-transformer-pytorch==0.4.0" "mogrifier==0.0.5" "einops==0.8.2"
LUCID=ok
"$VPY" -c 'import compressive_transformer_pytorch' || LUCID=failed

# 2. labml-nn 0.5.1 with labml 0.4.168 (labml needs gitpython -> gitdb -> smmap; pyyaml and numpy come from the
#    system). labml-nn declares torchtext/torchvision/fairscale, which the compressive model never imports; they are
#    deliberately NOT installed (they would pin another torch). The adapter stubs them where needed.
LABML=ok
"$VPY" -m pip install --no-deps --disable-pip-version-check \
  "labml-nn==0.5.1" "labml==0.4.168" "gitpython==3.1.45" "gitdb==4.0.12" "smmap==5.0.2" || LABML=failed
if [ "$LABML" = ok ]; then
  "$VPY" -c 'import labml_nn.transformers.compressive' || LABML=failed
fi

# 3. ours, editable, so every implementation runs under the same interpreter (torch is already there: nothing pulls another)
"$VPY" -m pip install --disable-pip-version-check -e "$HERE/.."
"$VPY" -c 'import compressive_transformer'

TORCH_AFTER="$("$VPY" -c 'import torch; print(torch.__version__)')"
if [ "$TORCH_BEFORE" != "$TORCH_AFTER" ]; then
  echo "ERROR: torch changed from $TORCH_BEFORE to $TORCH_AFTER inside $VENV" >&2
  exit 1
fi
echo "peers: compressive-transformer-pytorch=$LUCID labml-nn=$LABML (torch $TORCH_AFTER)"
