#!/usr/bin/env bash
# Hardware-counter profiles (Nsight Compute) of the kernels the open speed
# issues are about, in ONE call of the device tool. ncu reads the counters on
# the Firecracker H200 machines (device/KINDS.md); clocks are left alone
# (--clock-control none, device/METHOD.md).
#   here:  ninja -C build && scripts/gpu_bundle.sh build
#   there: scripts/gpu_profile.sh .gpu_bundle      (carry .gpu_bundle.tar.xz)
# Each job: one bench binary under ncu, the first N launches of the kernels
# matching a regex, --set full. Reports go to $OUT/profile/<job>.ncu-rep and
# their "details" page (speed of light, memory, compute, warp stalls,
# instruction mix, occupancy, with ncu's rule advice) to <job>.txt; everything
# is packed into $OUT/profile.tar.xz. On an x2 machine the two lanes run on
# their own GPU. env: PROFILE_JOBS (regex over job names), PROFILE_BUDGET_S.
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${1:-.gpu_bundle}
OUT=${OUT:-./out}
P="$OUT/profile"
mkdir -p "$P"
[ -x "$BUNDLE/turbodiff" ] || tar xJf "$BUNDLE.tar.xz"
B="$BUNDLE/bench"
BUDGET=${PROFILE_BUDGET_S:-400}
END=$(( $(date +%s) + BUDGET ))
NCU=(ncu --clock-control none --set full --import-source no --kernel-name-base mangled --target-processes application-only)
NGPU=${PROFILE_NGPU:-$(nvidia-smi -L 2>/dev/null | wc -l)}  # PROFILE_NGPU=1: one lane on GPU 0

# name | launches | kernel regex (mangled names) | command
LANE_A=(
  "gemm_block_scaled_qkv|1|int8_gemm_block_scaled_sm90_kernel|$B/bench_gemm --large-only --filter block_scaled_sm90_token128"
  "gemm_post_scale_qkv|1|device_kernel|$B/bench_gemm --large-only --filter post_scale_sm90"
  "gemm_cublas_bf16_qkv|1|nvjet|xmma|cutlass|$B/bench_gemm --large-only --filter cublas_bf16_only"
  "norm_rms|1|norm_rows_kernelILNS1_8NormKindE0|$B/bench_norm"
  "norm_layer_adaln_lean|2|norm_lean_kernel|$B/bench_norm"
  "quant_token128|1|quantize_token128_kernel|$B/bench_quant_rope"
  "ln_mod_quant_token128|1|ln_mod_quant_token128_kernel|$B/bench_quant_rope"
  "ln_mod_quant_block128|1|ln_mod_quant_block128_kernel|$B/bench_quant_rope"
)
LANE_B=(
  "sage_sm90_dense|1|sage_sm90_kernelILi128ELi1E|$B/bench_attention wan1.3b_480p_self --no-flash --no-sparse"
  "sage_sm90_sparse|1|sage_sm90_kernelILi128ELi2E|$B/bench_sla --quick"
  "sla_linear_staged|2|staged|$B/bench_sla --quick"
  "cudnn_sdpa|1|sdpa|fmha|flash|$B/bench_attention wan1.3b_480p_self --no-flash --no-sparse"
  "sagesla_pipeline|8|sage_sm90|topk|block_pool|kv_partial|kv_project|linear_apply|finalize|score_kernel|key_mean|quant_kernel|stats_kernel|$B/bench_sla --quick"
)

run_job() {  # $1: job spec, $2: GPU
  local spec="$1" name count cmd regex
  name=${spec%%|*}; spec=${spec#*|}
  count=${spec%%|*}; spec=${spec#*|}
  cmd=${spec##*|}; regex=${spec%|*}
  if [ -n "${PROFILE_JOBS:-}" ] && ! [[ $name =~ $PROFILE_JOBS ]]; then return; fi
  local left=$(( END - $(date +%s) ))
  if [ $left -lt 20 ]; then echo "$name: skipped (budget)" >> "$P/summary.txt"; return; fi
  local t0=$(date +%s)
  CUDA_VISIBLE_DEVICES=$2 timeout $left "${NCU[@]}" -k "regex:$regex" -c "$count" -f -o "$P/$name" $cmd \
    > "$P/$name.log" 2>&1
  local rc=$?
  if [ -f "$P/$name.ncu-rep" ]; then
    ncu -i "$P/$name.ncu-rep" --page details > "$P/$name.txt" 2>&1
    ncu -i "$P/$name.ncu-rep" --page raw --csv > "$P/$name.raw.csv" 2>&1
    export_sass "$P/$name.ncu-rep"
  fi
  echo "$name: rc $rc, $(( $(date +%s) - t0 )) s, $(grep -c '^  [a-zA-Z_].*(' "$P/$name.txt" 2>/dev/null || echo 0) kernels" >> "$P/summary.txt"
}

# Per-SASS-instruction counters and warp-stall samples (where the time goes
# inside a kernel), compressed: $1.sass.csv.xz beside the report.
export_sass() {
  ncu -i "$1" --page source --csv --print-source sass 2>&1 | xz -T2 > "${1%.ncu-rep}.sass.csv.xz"
}

lane() {  # $1: GPU, rest: job specs
  local gpu=$1; shift
  for j in "$@"; do run_job "$j" "$gpu"; done
}

ncu --version > "$P/ncu_version.txt" 2>&1
# PROFILE_REEXPORT_DIR: reports of an earlier call (carried): export their SASS pages too.
if [ -n "${PROFILE_REEXPORT_DIR:-}" ]; then
  for r in "$PROFILE_REEXPORT_DIR"/*.ncu-rep; do
    [ -f "$r" ] || continue
    export_sass "$r"
    cp "${r%.ncu-rep}.sass.csv.xz" "$P/$(basename "${r%.ncu-rep}").earlier.sass.csv.xz"
  done
fi
if [ "$NGPU" -ge 2 ]; then
  lane 0 "${LANE_A[@]}" & lane 1 "${LANE_B[@]}" & wait
else
  lane 0 "${LANE_A[@]}" "${LANE_B[@]}"
fi
tar cJf "$OUT/profile.tar.xz" -C "$OUT" --exclude "*.ncu-rep" profile
tar cf "$OUT/reports.tar" -C "$OUT" --wildcards profile/*.ncu-rep 2>/dev/null
rm -f "$P"/*.ncu-rep
rm -rf "$P"/*.ncu-rep.tmp 2>/dev/null
cat "$OUT"/profile/summary.txt
# the headline numbers of each kernel: duration, SM/memory throughput, tensor pipe
for f in "$P"/*.txt; do
  case $f in *summary.txt|*ncu_version.txt) continue ;; esac
  echo "== $(basename "$f" .txt)"
  grep -E '^  [^ ].*\(|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible' "$f" | head -40
done
