#!/usr/bin/env bash
# Everything one GPU session needs, in ONE call of the device tool (device time
# is the scarce resource: one machine start, both GPUs of an x2 machine busy):
#   lane A, GPU 0: scripts/e2e_gpu.sh (issue 9's stage table and the PyTorch
#     reference, issue 7's switch combinations), then `turbodiff generate` at
#     Wan-1.3B 480p with random-weight models in the layouts a user downloads
#     (bench/make_random_models.py; issue 8).
#   lane B, GPU 1: scripts/gpu_check.sh (doctor, every GPU test suite, the
#     kernel benches in BENCHES order), with a deadline.
# On a one-GPU machine the lanes run one after the other, each with half the time.
# All results are packed into $OUT/all.tar.xz (the device tool returns at most
# 8 files), summaries are printed last.
#   here:  ninja -C build && scripts/gpu_bundle.sh build
#   there: scripts/gpu_session.sh .gpu_bundle   (carry .gpu_bundle.tar.xz and .whl_e2e)
# env: SESSION_BUDGET_S (default 560), BENCHES, BENCH_ARGS_<bench>, GENERATE_ARGS,
#      LANE_A_MODE=benches with BENCHES_A / BENCH_FILTER_A (lane A measures benches instead of e2e).
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${1:-.gpu_bundle}
OUT=${OUT:-./out}
TOTAL=${SESSION_BUDGET_S:-560}
START=$(date +%s)
DEADLINE=$(( START + TOTAL ))
[ -x "$BUNDLE/turbodiff" ] || tar xJf "$BUNDLE.tar.xz"
W="$OUT/work"
mkdir -p "$W/e2e" "$W/check" "$W/generate"
export PYTHONUNBUFFERED=1
WHEELS=${E2E_WHEELS:-.whl_e2e}
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
    > "$W/pip.log" 2>&1 && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
nvidia-smi -L > "$W/gpus.txt" 2>&1

left() { echo $(( DEADLINE - $(date +%s) )); }

generate_real_size() {  # $1: seconds for this part
  local log="$W/generate/generate_log.txt" end=$(( $(date +%s) + $1 ))
  if [ "$1" -lt 30 ]; then echo "generate: skipped ($1 s left)" > "$log"; return; fi
  local td="$(pwd)/$BUNDLE/turbodiff"
  export LD_LIBRARY_PATH="$(cd "$BUNDLE/lib" 2>/dev/null && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "== random models (at $(( $(date +%s) - START ))s)" >> "$log"
  timeout $(( end - $(date +%s) )) python3 bench/make_random_models.py --out /tmp/rand --model 1.3B >> "$log" 2>&1 \
    || { echo "make_random_models failed" >> "$log"; return; }
  mkdir -p /tmp/frames /tmp/frames2
  local common=(generate --dit /tmp/rand/dit --vae /tmp/rand/vae --text-encoder /tmp/rand/umt5 --tokenizer /tmp/rand/tokenizer
                --prompt "A red fox walks through fresh snow in a birch forest at dawn, cinematic" --num-frames 81
                --resolution 480p --device cuda --json)
  # The fully accelerated configuration (SageSLA with proj_l = 0: the random model has no SLA weights; W8A8).
  echo "== generate 1.3B 480p sagesla + W8A8, 2 samples (at $(( $(date +%s) - START ))s)" >> "$log"
  timeout $(( end - $(date +%s) )) "$td" "${common[@]}" --attention sagesla --quant-linear --num-samples 2 \
    ${GENERATE_ARGS:-} -o /tmp/frames/f%04d.png > "$W/generate/generate_1.3B.json" 2>> "$log"
  echo "exit $?" >> "$log"
  cp /tmp/frames/f0040_0.png "$W/generate/" 2>/dev/null || cp "$(ls /tmp/frames/*.png 2>/dev/null | sed -n 41p)" "$W/generate/" 2>/dev/null
  ls /tmp/frames | wc -l >> "$log"
  # Peak memory with each model on the GPU only while it runs.
  if [ $(( end - $(date +%s) )) -gt 40 ]; then
    echo "== generate 1.3B 480p --offload model (at $(( $(date +%s) - START ))s)" >> "$log"
    timeout $(( end - $(date +%s) )) "$td" "${common[@]}" --attention sagesla --quant-linear --offload model \
      -o /tmp/frames2/f%04d.png > "$W/generate/generate_1.3B_offload.json" 2>> "$log"
    echo "exit $?" >> "$log"
  fi
}

lane_a() {  # $1: seconds
  if [ "${LANE_A_MODE:-e2e}" = benches ]; then
    # LANE_A_MODE=benches: lane A runs only the benches named in BENCHES_A
    # (BENCH_FILTER_A: their PyTorch scripts), so that both GPUs measure.
    mkdir -p "$W/check_a"
    CUDA_VISIBLE_DEVICES=${LANE_A_GPU:-0} OUT="$W/check_a" SKIP_CPU_TESTS=1 SKIP_GPU_TESTS=1 DEADLINE=$DEADLINE_A \
      BENCHES="${BENCHES_A:-}" scripts/gpu_check.sh "$BUNDLE" "${BENCH_FILTER_A:-^bench_}" > "$W/check_a/stdout.txt" 2>&1
    return
  fi
  local budget=$1 gen=${GENERATE_BUDGET_S:-140}
  CUDA_VISIBLE_DEVICES=${LANE_A_GPU:-0} OUT="$W/e2e" E2E_SKIP_TESTS=1 E2E_BUDGET_S=$(( budget - gen )) \
    scripts/e2e_gpu.sh "$BUNDLE" > "$W/e2e/stdout.txt" 2>&1
  CUDA_VISIBLE_DEVICES=${LANE_A_GPU:-0} generate_real_size $(( DEADLINE_A - $(date +%s) ))
}
lane_b() {
  CUDA_VISIBLE_DEVICES=${LANE_B_GPU:-1} OUT="$W/check" SKIP_CPU_TESTS=1 DEADLINE=$DEADLINE_B GPU_TEST_JOBS=${GPU_TEST_JOBS:-6} \
    scripts/gpu_check.sh "$BUNDLE" "${BENCH_FILTER:-.}" > "$W/check/stdout.txt" 2>&1
}

if [ "$NGPU" -ge 2 ]; then
  DEADLINE_A=$DEADLINE DEADLINE_B=$DEADLINE
  lane_a "$TOTAL" &
  pa=$!
  lane_b &
  pb=$!
  wait $pa $pb
else
  half=$(( TOTAL / 2 ))
  DEADLINE_B=$(( START + half )) LANE_B_GPU=0 lane_b
  DEADLINE_A=$DEADLINE LANE_A_GPU=0 lane_a $(( DEADLINE - $(date +%s) ))
fi

tar cJf "$OUT/all.tar.xz" -C "$W" . 2>/dev/null
echo "===== gpu_check summary"
sed -n '/===== summary/,$p' "$W/check/log.txt" 2>/dev/null
grep -E "^\[  FAILED  \]" "$W/check/log.txt" 2>/dev/null | sort -u | head -30
if [ -f "$W/check_a/log.txt" ]; then echo "===== lane A benches"; sed -n '/===== summary/,$p' "$W/check_a/log.txt"; fi
echo "===== e2e"
cat "$W/e2e/e2e_table.txt" 2>/dev/null || tail -20 "$W/e2e/stdout.txt"
echo "===== generate"
tail -12 "$W/generate/generate_log.txt" 2>/dev/null
head -c 1500 "$W/generate/generate_1.3B.json" 2>/dev/null; echo
head -c 600 "$W/generate/generate_1.3B_offload.json" 2>/dev/null; echo
echo "gpu_session: $(( $(date +%s) - START ))s, $NGPU GPU(s)"
