#!/usr/bin/env bash
# On the H200 (device tool; carry .gpu_bundle.tar.xz from scripts/gpu_bundle.sh):
# the sage/SLA GPU tests, then bench_attention and bench_sla once per mode in
# MODES (default "p np": the default dispatch, then one CTA per unit with
# TURBODIFF_SAGE_SM90_PERSIST=0), results packed into $OUT/r.tar.xz.
# env: TEST_FILTER (gtest filter, default the sage/SLA suites), SKIP_BENCH=1,
# SKIP_SLA=1, MODES, ATTN_ARGS (extra bench_attention arguments).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d .gpu_bundle ] || tar xJf .gpu_bundle.tar.xz
OUT=${OUT:-./out}
R=$OUT/r
mkdir -p "$R"
export TURBODIFF_SOURCE_DIR=$(pwd) TURBODIFF_CLI=$(pwd)/.gpu_bundle/turbodiff
export LD_LIBRARY_PATH=$(pwd)/.gpu_bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=.gpu_bundle
nvidia-smi -L > "$R/smi.txt" 2>&1
$B/turbodiff_gpu_tests --gtest_filter="${TEST_FILTER:-*Sage*:*Sla*:*SLA*}" > "$R/tests.txt" 2>&1
echo "rc=$?" >> "$R/tests.txt"
if [ "${SKIP_BENCH:-0}" = 0 ]; then
  for mode in ${MODES:-p np}; do
    if [ "$mode" = np ]; then export TURBODIFF_SAGE_SM90_PERSIST=0; else unset TURBODIFF_SAGE_SM90_PERSIST; fi
    $B/bench/bench_attention wan --no-flash ${ATTN_ARGS:-} > "$R/attn_$mode.json" 2> "$R/attn_$mode.err"
    [ "${SKIP_SLA:-0}" = 0 ] && $B/bench/bench_sla > "$R/sla_$mode.json" 2> "$R/sla_$mode.err"
  done
  unset TURBODIFF_SAGE_SM90_PERSIST
fi
grep -E "^\[  (PASSED|FAILED)" "$R/tests.txt" | tail -3
(cd "$OUT" && tar cf - r | xz -T4 > r.tar.xz && rm -rf r)
