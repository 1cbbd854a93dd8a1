#!/usr/bin/env bash
# Builds every fuzz/fuzz_*.cpp target with clang + libFuzzer + ASan/UBSan and
# runs each for a while on a scratch copy of its committed corpus.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# SECONDS: time per target (default $FUZZ_SECONDS, else 60). TARGET: names such
# as fuzz_safetensors (default: all). Findings (crash-*, leak-*, timeout-*,
# oom-*) go to fuzz/findings/<target>/ (git-ignored); logs and the grown
# corpora to $FUZZ_BUILD_DIR (default build-fuzz). Prints one summary line per
# target; exits 1 if any target found something, 2 on a usage or build error.
#
# Other knobs: FUZZ_MAX_LEN (default 4096), FUZZ_RSS_MB (default 2048),
# FUZZ_JOBS (build parallelism, default 2). A fuzz/<target>.dict file, when
# present, is passed as the libFuzzer dictionary.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${FUZZ_BUILD_DIR:-$root/build-fuzz}"
seconds="${FUZZ_SECONDS:-60}"
if [[ $# -gt 0 && "$1" =~ ^[0-9]+$ ]]; then
  seconds="$1"
  shift
fi
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [[ "$seconds" -eq 0 ]]; then
  echo "fuzz.sh: seconds must be a positive integer, got '$seconds'" >&2
  exit 2
fi
max_len="${FUZZ_MAX_LEN:-4096}"
rss_mb="${FUZZ_RSS_MB:-2048}"
jobs="${FUZZ_JOBS:-2}"

for tool in clang clang++ cmake; do
  command -v "$tool" >/dev/null || { echo "fuzz.sh: $tool not found (libFuzzer needs clang)" >&2; exit 2; }
done

# The targets: every fuzz/fuzz_*.cpp, or the ones named on the command line.
all_targets=()
for src in "$root"/fuzz/fuzz_*.cpp; do
  [[ -e "$src" ]] && all_targets+=("$(basename "$src" .cpp)")
done
if [[ $# -gt 0 ]]; then
  targets=()
  for t in "$@"; do
    [[ -e "$root/fuzz/$t.cpp" ]] || { echo "fuzz.sh: no fuzz/$t.cpp (have: ${all_targets[*]:-none})" >&2; exit 2; }
    targets+=("$t")
  done
else
  targets=("${all_targets[@]}")
fi
[[ ${#targets[@]} -gt 0 ]] || { echo "fuzz.sh: no fuzz/fuzz_*.cpp targets" >&2; exit 2; }

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  mkdir -p "$build"
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" "${generator[@]}" "${launcher[@]}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTURBODIFF_FUZZ=ON -DTURBODIFF_ENABLE_CUDA=OFF \
    -DTURBODIFF_BUILD_TESTS=OFF >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log" >&2; echo "fuzz.sh: configure failed" >&2; exit 2; }
fi
echo "fuzz.sh: building ${targets[*]} in $build"
cmake --build "$build" -j "$jobs" --target "${targets[@]}" ||
  { echo "fuzz.sh: build failed" >&2; exit 2; }

# UBSan must stop at the first report, or libFuzzer never sees it as a crash.
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"

status=0
mkdir -p "$build/logs" "$build/corpus"
for t in "${targets[@]}"; do
  findings="$root/fuzz/findings/$t"
  work="$build/corpus/$t"
  log="$build/logs/$t.log"
  mkdir -p "$findings" "$work"
  # A scratch copy: what the fuzzer adds does not touch the committed corpus.
  if [[ -d "$root/fuzz/corpus/$t" ]]; then cp -f "$root/fuzz/corpus/$t"/* "$work"/ 2>/dev/null || true; fi
  before=$(find "$findings" -type f | wc -l)
  dict=()
  [[ -f "$root/fuzz/$t.dict" ]] && dict=("-dict=$root/fuzz/$t.dict")
  start=$(date +%s)
  set +e
  "$build/fuzz/$t" "$work" "${dict[@]}" -max_total_time="$seconds" -max_len="$max_len" -rss_limit_mb="$rss_mb" \
    -timeout=10 -print_final_stats=1 -artifact_prefix="$findings/" >"$log" 2>&1
  rc=$?
  set -e
  elapsed=$(( $(date +%s) - start ))
  after=$(find "$findings" -type f | wc -l)
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -o ' cov: [0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  ft=$(grep -o ' ft: [0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  corpus=$(find "$work" -type f | wc -l)
  new=$(( after - before ))
  verdict="ok"
  if [[ $rc -ne 0 || $new -gt 0 ]]; then
    verdict="FOUND $new (exit $rc): see $findings and $log"
    status=1
  fi
  printf '%s: %s runs in %ss, cov %s ft %s, corpus %s, crashes %s -- %s\n' \
    "$t" "${runs:-?}" "$elapsed" "${cov:-?}" "${ft:-?}" "$corpus" "$new" "$verdict"
done
exit $status
