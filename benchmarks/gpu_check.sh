#!/usr/bin/env bash
# The prepared GPU check: on one H100/H200 with only the machine's own PyTorch (2.11 or newer, with Triton) and the
# peers' pure-Python wheels, in at most 8 minutes. Each part runs under its own time limit and writes its results
# as it finishes, so a run cut off part-way still reports what it reached:
#
#   1. env      the GPU, torch and Triton versions
#   2. kernel   the fused attention at the `gpu` workload's shape, bf16: the current kernels (their tiles tuned on the
#               first call) against the first fused kernel (frozen in benchmarks/impls/fused_v1), the reference with
#               explicit scores and SDPA-with-a-bias; forward and forward + backward ms, TFLOP/s of useful work
#   3. peers    the peers' wheels (compressive-transformer-pytorch 0.4.0, labml-nn 0.5.1 and their needs) from
#               WHEELS (default .whl/) into a private folder, no index, no dependencies pulled
#   4. bench    the `gpu` workload in bf16: ours (captured and eager), our Transformer-XL at equal keys, the peers
#   5. profile  the captured and the eager training step's kernel time by kind (attention, matmuls, copies, ...)
#   6. tests    the CUDA tests with full failure output: the fused kernel against the reference, every kernel in
#               training, bf16/fp16, the captured update and the graphed decoder, the trainer end to end (60 s each)
#   7. compile  the compiled ones (training, and the decoder compiled and replayed as generate runs it on a GPU),
#               each under its own 240 s limit; within the default budget they get what the parts before left
#               (BUDGET=720 gives them their whole time)
#   8. paper    one update of configs/enwik8.toml timed, and the hours to its schedule's tokens
#   9. more     what time is left: fp32, and the other kernels captured
#
#   bash benchmarks/gpu_check.sh [OUT]        # OUT defaults to $OUT, else benchmarks/results/gpu
#   DEVICE=cpu bash benchmarks/gpu_check.sh /tmp/dry   # the whole script on the CPU at tiny sizes (a dry run)
#
# OUT gets summary.txt (one line per part: its status and seconds), tests.log, bench.log (the versions and every
# benchmark's output), kernel.json (rewritten after each implementation), gpu.json / gpu.md (the benchmark table),
# profile_step.json, gpu-more.json and paper_time.json.
set -u
cd "$(dirname "$0")/.."
OUT="${1:-${OUT:-benchmarks/results/gpu}}"
WHEELS="${WHEELS:-.whl}"
BUDGET="${BUDGET:-470}"  # seconds for all parts together
PY="${PYTHON:-python3}"
DEVICE="${DEVICE:-cuda}"
if [ "$DEVICE" = cpu ]; then  # a dry run: tiny sizes, the fused kernels through Triton's interpreter if installed
  WORKLOAD=tiny
  PAPER=(--device cpu --steps 1 --set model.n_layers=2 --set model.d_model=32 --set model.d_ff=64 --set model.seg_len=16
    --set model.memory.mem_len=16 --set model.memory.cmem_len=8 --set train.batch_size=2 --set train.amp=none)
  KERNEL=(--device cpu)
  PROFILE=(--workload tiny)
  TESTS=(tests/test_cuda.py)  # they skip without a GPU: the part's command is what a dry run checks
  export TORCHDYNAMO_DISABLE=1
else
  WORKLOAD=gpu PAPER=() KERNEL=() PROFILE=()
  TESTS=(tests/test_kernel_triton.py tests/test_cuda.py "tests/test_kernels.py::test_cuda_training_equals_the_reference")
fi
mkdir -p "$OUT"
START=$(date +%s)
PEERS_DIR="${PEERS_DIR:-$(mktemp -d)}"  # the peers' wheels unpacked here, nowhere else
export PYTHONPATH="$PWD/src:$PWD:$PEERS_DIR${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/gpu-check-inductor
: > "$OUT/summary.txt"

# part NAME LIMIT LOG CMD...: run CMD with at most LIMIT seconds (less when the budget runs short), output to LOG
part() {
  local name=$1 limit=$2 log=$3
  shift 3
  local left=$((BUDGET - ($(date +%s) - START)))
  if [ "$left" -lt 10 ]; then
    echo "$name: skipped (budget spent)" >> "$OUT/summary.txt"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0
  t0=$(date +%s)
  echo "== $name (limit ${limit}s)" >> "$log"
  timeout --kill-after=5 "$limit" "$@" >> "$log" 2>&1
  local rc=$?
  local status=ok
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && status="timed out after ${limit}s"
  [ "$rc" -ne 0 ] && [ "$status" = ok ] && status="failed (exit $rc)"
  echo "$name: $status, $(($(date +%s) - t0))s" >> "$OUT/summary.txt"
}

part env 30 "$OUT/bench.log" "$PY" -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'); import triton; print('triton', triton.__version__)"
part kernel 100 "$OUT/bench.log" "$PY" -m benchmarks.fused_attention "${KERNEL[@]}" --out "$OUT/kernel.json"
part peers 30 "$OUT/bench.log" "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$PEERS_DIR" $WHEELS/*.whl
part bench 150 "$OUT/bench.log" "$PY" -m benchmarks.gpu --workload $WORKLOAD --device "$DEVICE" --amp bf16 \
  --python "$PY" --out "$OUT" --name gpu --impl ours+graphs,ours,ours_txl+graphs,lucidrains,labml
part profile 50 "$OUT/bench.log" "$PY" -m benchmarks.profile_gpu_step "${PROFILE[@]}" --kernels fused \
  --out "$OUT/profile_step.json"
part tests 60 "$OUT/tests.log" "$PY" -m pytest -q -p no:cacheprovider --tb=long -rfE --timeout 60 -k "not compiled" \
  "${TESTS[@]}"
part compile 240 "$OUT/tests.log" "$PY" -m pytest -q -p no:cacheprovider --tb=long -rfE --timeout 240 -k compiled \
  tests/test_cuda.py
part paper 60 "$OUT/bench.log" "$PY" -m benchmarks.paper_time "${PAPER[@]}" --out "$OUT"
part more 600 "$OUT/bench.log" "$PY" -m benchmarks.gpu --workload $WORKLOAD --device "$DEVICE" --amp none,bf16 \
  --python "$PY" --out "$OUT" \
  --name gpu-more --impl ours+graphs,ours+sdpa-bias+graphs,ours+reference+compile,lucidrains
rm -f "$OUT/gpu-more.md"  # its table is in bench.log; eight files come back at most
cat "$OUT/summary.txt"
