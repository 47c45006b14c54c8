#!/usr/bin/env bash
# The prepared GPU check: on one H100/H200 with only the machine's own PyTorch (2.11 or newer, with Triton) and the
# peers' pure-Python wheels, the parts that decide the GPU path first, the whole within BUDGET seconds (420: a
# 15-minute window keeps room for the start and for rerunning a part). Each part runs under its own time limit
# (SIGINT when it runs out, so pytest still prints its failures), writes its results as it ends, and can be rerun
# alone; the end prints a one-screen summary (benchmarks/gpu_summary.py).
#
#   1. env         versions of everything the later parts import
#   2. warm        every tuned configuration of every fused-attention pass, the first kernel, FlexAttention and the
#                  compiled step, in parallel, one process each, into the caches the later parts read (warm_kernels.py)
#   3. kernels     fused, the first fused kernel, sdpa-bias, flex and the explicit reference at the `gpu` shape: each
#                  pass by CUDA events, forward and backward TFLOP/s of useful work, saved-for-backward MiB
#   4. step        the training step as the trainer builds it (kept bf16 weights), compiled and captured: tokens/s,
#                  MFU, peak memory, one graph replay profiled by kernel kind (profile_gpu_step.py)
#   5. tests-cuda  the CUDA-shape and graph-capture tests, alone
#   6. tests       the rest of the GPU test files, -m "not slow"
#   7. step-flex   the step with attn_impl = "flex"
#   8. peers       the peers' wheels from WHEELS (default .whl/) into a private folder, no index, no dependencies
#   9. train       ours (captured) against the peers, training, bf16 (benchmarks/gpu.py --phase train)
#  10. eval        evaluation, likewise;  11. generation  generation, likewise
#  12. paper       one update of configs/enwik8.toml timed, and the hours to its schedule's tokens
#
#   bash benchmarks/gpu_check.sh prepare            # download the peers' wheels into WHEELS (what the window carries)
#   bash benchmarks/gpu_check.sh [OUT] [PART...]    # OUT defaults to $OUT, else benchmarks/results/gpu; PARTs: rerun
#   DEVICE=cpu bash benchmarks/gpu_check.sh /tmp/dry  # every part's code path on the CPU at tiny sizes (a dry run;
#                                                   # the step eager, with sdpa-bias: the interpreter is slow)
#
# OUT gets summary.txt (one line per part: its status and seconds; a rerun replaces its part's line), <part>.log,
# warm.json, kernels.json, step.json, step-flex.json, gpu-train/-eval/-generation.json and .md, paper_time.json.
# The exit status is 1 when a part failed or ran out of time.
set -u
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
WHEELS="${WHEELS:-.whl}"
if [ "${1:-}" = prepare ]; then
  exec "$PY" -m pip download --no-deps --dest "$WHEELS" -r benchmarks/peers-requirements.txt
fi
OUT="${1:-${OUT:-benchmarks/results/gpu}}"
shift $(($# > 0 ? 1 : 0))
ONLY=" $* "
BUDGET="${BUDGET:-420}"  # seconds for all parts together
SCALE="${LIMIT_SCALE:-1}"  # every part's limit times this (a dry run on a loaded CPU)
DEVICE="${DEVICE:-cuda}"
GPU_TESTS=(tests/test_kernel_triton.py tests/test_cuda.py tests/test_kernels.py tests/test_kernel_flex.py tests/test_captured.py)
CUDA_TESTS="benchmark_shape or graph_captures or captured_update_on_cuda or cuda_training_equals or compiled_and_captured_trainer_step_on_cuda"
if [ "$DEVICE" = cpu ]; then  # a dry run: tiny sizes, the fused kernels through Triton's interpreter, the step eager
  WORKLOAD=tiny STEP=(--no-compile --replays 1) STEP_KERNEL=sdpa-bias
  PAPER=(--device cpu --steps 1 --set model.n_layers=2 --set model.d_model=32 --set model.d_ff=64 --set model.seg_len=16
    --set model.memory.mem_len=16 --set model.memory.cmem_len=8 --set train.batch_size=2 --set train.amp=none)
  GPU_TESTS=(tests/test_cuda.py)  # they skip without a GPU: the part's command is what a dry run checks
else
  WORKLOAD=gpu PAPER=() STEP=() STEP_KERNEL=fused
fi
mkdir -p "$OUT"
touch "$OUT/summary.txt"
START=$(date +%s)
FAILED=0
PEERS_DIR="${PEERS_DIR:-$OUT/.peers}"  # the peers' wheels unpacked here, nowhere else
export PYTHONPATH="$PWD/src:$PWD:$PEERS_DIR${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/gpu-check-triton}" TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-/tmp/gpu-check-inductor}"
PYTEST=("$PY" -m pytest -q -p no:cacheprovider --tb=short -rfE)
"$PY" -c "import pytest_timeout" 2>/dev/null && PYTEST+=(--timeout 120)

# part NAME LIMIT CMD...: CMD with at most LIMIT seconds (less when the budget runs short), output to OUT/NAME.log,
# its line in summary.txt replaced; skipped when PARTs were named and NAME is not one of them
part() {
  local name=$1 limit=$(($2 * SCALE))
  shift 2
  if [ "$ONLY" != "  " ] && [[ "$ONLY" != *" $name "* ]]; then
    return
  fi
  local left=$((BUDGET - ($(date +%s) - START))) status
  sed -i "/^$name: /d" "$OUT/summary.txt"
  if [ "$left" -lt 10 ]; then
    echo "$name: skipped (budget spent)" >> "$OUT/summary.txt"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0
  t0=$(date +%s)
  echo "== $name (limit ${limit}s, $(date -u +%H:%M:%S))" > "$OUT/$name.log"
  timeout -s INT --kill-after=15 "$limit" "$@" >> "$OUT/$name.log" 2>&1
  local rc=$?
  case $rc in
    0) status=ok ;;
    124 | 130 | 137) status="timed out after ${limit}s" ;;
    *) status="failed (exit $rc)" ;;
  esac
  [ "$rc" -ne 0 ] && FAILED=1
  echo "$name: $status, $(($(date +%s) - t0))s" >> "$OUT/summary.txt"
}

peers() {  # the wheels (files only) into PEERS_DIR; none there: nothing to install, the peers' rows say so
  local wheels=()
  while IFS= read -r -d '' f; do wheels+=("$f"); done < <(find "$WHEELS" -maxdepth 1 -type f -name '*.whl' -print0 2>/dev/null)
  if [ "${#wheels[@]}" -eq 0 ]; then
    echo "no wheels in $WHEELS (bash benchmarks/gpu_check.sh prepare downloads them)"
    return 0
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$PEERS_DIR" "${wheels[@]}"
}

export -f peers
export PY WHEELS PEERS_DIR
versions='import sys, torch, triton, numpy, hypothesis, pytest
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)
print("numpy", numpy.__version__, "hypothesis", hypothesis.__version__, "pytest", pytest.__version__)
print("device", torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")
from torch.nn.attention import flex_attention; import compressive_transformer; print("flex_attention: ok")'
GPU=(--workload "$WORKLOAD" --device "$DEVICE" --amp bf16 --python "$PY" --out "$OUT" --threads 4)

part env 30 "$PY" -c "$versions"
part warm 100 "$PY" -m benchmarks.warm_kernels --device "$DEVICE" --out "$OUT/warm.json"
part kernels 70 "$PY" -m benchmarks.fused_attention --device "$DEVICE" --out "$OUT/kernels.json"
part step 100 "$PY" -m benchmarks.profile_gpu_step --workload "$WORKLOAD" --device "$DEVICE" --kernels "$STEP_KERNEL" \
  "${STEP[@]}" --out "$OUT/step.json"
part tests-cuda 90 "${PYTEST[@]}" -k "$CUDA_TESTS" "${GPU_TESTS[@]}"
part tests 60 "${PYTEST[@]}" -m "not slow" -k "not ($CUDA_TESTS)" "${GPU_TESTS[@]}"
part step-flex 90 "$PY" -m benchmarks.profile_gpu_step --workload "$WORKLOAD" --device "$DEVICE" --kernels flex \
  "${STEP[@]}" --out "$OUT/step-flex.json"
part peers 20 bash -c peers
part train 90 "$PY" -m benchmarks.gpu "${GPU[@]}" --phase train --name gpu-train --impl ours+graphs,lucidrains,labml
part eval 45 "$PY" -m benchmarks.gpu "${GPU[@]}" --phase eval --name gpu-eval --impl ours+graphs,lucidrains,labml
part generation 45 "$PY" -m benchmarks.gpu "${GPU[@]}" --phase generate --name gpu-generation \
  --impl ours+graphs,lucidrains
part paper 60 "$PY" -m benchmarks.paper_time "${PAPER[@]}" --out "$OUT"
"$PY" -m benchmarks.gpu_summary "$OUT"
exit $FAILED
