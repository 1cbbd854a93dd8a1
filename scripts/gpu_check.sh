#!/usr/bin/env bash
# Runs on the GPU machine, in the repository root, over binaries built on a
# machine without a GPU (scripts/gpu_bundle.sh): doctor, the GPU tests, the CPU
# tests (to show the binaries work there), every bench and every PyTorch
# comparison script, in one go. Writes under ${OUT:-./out}:
#   log.txt (everything printed), results.json (doctor + every bench's JSON),
#   gpu_tests.json / cpu_tests.json (gtest reports), and prints a summary last.
#   scripts/gpu_check.sh [bundle-dir] [bench-filter-regex]
#   env: GTEST_FILTER (GPU test subset), SKIP_CPU_TESTS=1, SKIP_GPU_TESTS=1
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${1:-.gpu_bundle}
FILTER=${2:-.}
OUT=${OUT:-./out}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
: > "$LOG"
export TURBODIFF_SOURCE_DIR=$(pwd) TURBODIFF_CLI=$(pwd)/$BUNDLE/turbodiff PYTHONUNBUFFERED=1
# cuDNN and NVRTC are linked dynamically; on machines where they come only
# with PyTorch's wheels (nvidia-* packages), put those folders on the loader path.
extra=$(python3 - <<'PY' 2>/dev/null
import importlib, os
dirs = []
for mod in ("nvidia.cudnn", "nvidia.cuda_nvrtc", "nvidia.cublas", "nvidia.nccl", "nvidia.cu13"):
    try:
        m = importlib.import_module(mod)
        for base in list(getattr(m, "__path__", [])):
            for sub in ("lib", "lib64"):
                d = os.path.join(base, sub)
                if os.path.isdir(d):
                    dirs.append(d)
    except Exception:
        pass
print(":".join(dirs))
PY
)
[ -n "$extra" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$extra"
# Libraries carried with the bundle (scripts/gpu_bundle.sh) come first.
[ -d "$BUNDLE/lib" ] && export LD_LIBRARY_PATH="$(cd "$BUNDLE/lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
declare -a SUMMARY
RESULTS="$OUT/results.json.parts"
: > "$RESULTS"

section() { echo "===== $* =====" | tee -a "$LOG"; }
add_result() {  # name file
  python3 - "$1" "$2" >> "$RESULTS" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
try:
    txt = open(path).read()
    start = txt.find('{')
    val = json.loads(txt[start:]) if start >= 0 else {"error": "no JSON", "text": txt[-2000:]}
except Exception as e:
    val = {"error": str(e)}
print(json.dumps({"name": name, "result": val}))
PY
}

section "nvidia-smi"
nvidia-smi -L >> "$LOG" 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >> "$LOG" 2>&1

section "doctor"
"$BUNDLE/turbodiff" doctor >> "$LOG" 2>&1
"$BUNDLE/turbodiff" doctor --json --require-cuda > "$OUT/doctor.json" 2>> "$LOG"
rc=$?
SUMMARY+=("doctor --require-cuda: exit $rc")
add_result doctor "$OUT/doctor.json"

if [ -x "$BUNDLE/turbodiff_gpu_tests" ] && [ "${SKIP_GPU_TESTS:-0}" != 1 ]; then
  section "GPU tests"
  # One process per test suite: a kernel fault leaves the CUDA context unusable,
  # and would otherwise fail every test that runs after it.
  suites=$("$BUNDLE/turbodiff_gpu_tests" --gtest_list_tests ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} | grep -E '^[^ ].*\.$' | sed 's/\.$//')
  # Suites run GPU_TEST_JOBS at a time (default 4): most of a correctness
  # test's time is its host-side reference, so they overlap well on one GPU,
  # and device time is scarce. Benchmarks below run alone.
  mkdir -p "$OUT/suites"
  export BUNDLE OUT
  printf '%s\n' $suites | xargs -P "${GPU_TEST_JOBS:-4}" -I{} bash -c \
    'n=$(echo "{}" | tr / _); timeout 300 "$BUNDLE/turbodiff_gpu_tests" --gtest_filter="{}.*" > "$OUT/suites/$n.log" 2>&1; echo $? > "$OUT/suites/$n.rc"'
  pass=0; fail=0; failed_suites=""
  for s in $suites; do
    n=$(echo "$s" | tr / _)
    cat "$OUT/suites/$n.log" >> "$LOG"
    if [ "$(cat "$OUT/suites/$n.rc" 2>/dev/null)" = 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); failed_suites="$failed_suites $s"; fi
  done
  rm -rf "$OUT/suites"
  SUMMARY+=("GPU test suites: $pass passed, $fail failed:$failed_suites")
fi

if [ "${SKIP_CPU_TESTS:-0}" != 1 ]; then
  section "CPU tests"
  "$BUNDLE/turbodiff_tests" --gtest_brief=1 --gtest_output=json:"$OUT/cpu_tests.json" > "$OUT/cpu_tests.log" 2>&1
  rc=$?
  tail -5 "$OUT/cpu_tests.log" >> "$LOG"
  SUMMARY+=("CPU tests: exit $rc, $(grep -E '^\[  (PASSED|FAILED)' "$OUT/cpu_tests.log" | tr '\n' ' ')")
  rm -f "$OUT/cpu_tests.log"
fi

# DEADLINE (epoch seconds, optional): benches and scripts that would start
# later than 20 s before it are skipped, and each one's limit ends at it.
# BENCHES (optional): bench binaries to run, in this order (default: all);
# BENCH_ARGS_<binary> (optional): its arguments.
limit() {
  local l=300
  if [ -n "${DEADLINE:-}" ]; then
    local r=$(( DEADLINE - $(date +%s) ))
    [ "$r" -lt "$l" ] && l=$r
  fi
  echo "$l"
}
bench_list=""
if [ -n "${BENCHES:-}" ]; then
  for n in $BENCHES; do bench_list="$bench_list $BUNDLE/bench/$n"; done
else
  bench_list=$(ls "$BUNDLE"/bench/bench_* 2>/dev/null)
fi
for b in $bench_list; do
  [ -x "$b" ] || continue
  name=$(basename "$b")
  echo "$name" | grep -Eq "$FILTER" || continue
  if [ "$(limit)" -le 20 ]; then SUMMARY+=("$name: skipped (deadline)"); continue; fi
  section "$name"
  start=$(date +%s)
  args_var="BENCH_ARGS_$name"  # e.g. BENCH_ARGS_bench_attention="wan --no-flash"
  timeout "$(limit)" "$b" ${!args_var:-} > "$OUT/$name.out" 2>> "$LOG"
  rc=$?
  cat "$OUT/$name.out" >> "$LOG"
  add_result "$name" "$OUT/$name.out"
  rm -f "$OUT/$name.out"
  SUMMARY+=("$name: exit $rc in $(( $(date +%s) - start ))s")
done

for py in bench/torch_*.py; do
  [ -f "$py" ] || continue
  name=$(basename "$py" .py)
  echo "$name" | grep -Eq "$FILTER" || continue
  if [ "$(limit)" -le 20 ]; then SUMMARY+=("$name: skipped (deadline)"); continue; fi
  section "$name"
  start=$(date +%s)
  timeout "$(limit)" python3 "$py" > "$OUT/$name.out" 2>> "$LOG"
  rc=$?
  cat "$OUT/$name.out" >> "$LOG"
  add_result "$name" "$OUT/$name.out"
  rm -f "$OUT/$name.out"
  SUMMARY+=("$name: exit $rc in $(( $(date +%s) - start ))s")
done

python3 - "$RESULTS" "$OUT/results.json" <<'PY'
import json, sys
parts = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
json.dump({p["name"]: p["result"] for p in parts}, open(sys.argv[2], "w"), indent=1)
PY
rm -f "$RESULTS"

section "summary"
for s in "${SUMMARY[@]}"; do echo "$s" | tee -a "$LOG"; done
