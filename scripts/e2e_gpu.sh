#!/usr/bin/env bash
# Issue 9 on the H200, in ONE `run` call of at most 8 minutes: `turbodiff bench
# e2e` for Wan2.1-1.3B 480p (stages a-d, VAE, text encoder, profile) and
# Wan2.1-14B 720p (stages c, d with the VAE first; stage a when time is left),
# and the PyTorch reference (diffusers' WanTransformer3DModel, BF16, SDPA) of
# the same forward for both, in the same run. JSON to $OUT, a table at the end.
#
# Here (no GPU):  ninja -C <build> turbodiff && scripts/gpu_bundle.sh <build>
#                 (or any folder holding a CUDA build of turbodiff; lib/ with
#                 libsentencepiece as gpu_bundle.sh packs it)
#                 python wheels: .whl_e2e/ (diffusers 0.42.1, importlib_metadata 8.7.0; 6.1 MiB):
#                   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#                     --platform manylinux_2_28_x86_64 -d .whl_e2e diffusers==0.42.1 importlib_metadata==8.7.0
# On the GPU:     run(command="scripts/e2e_gpu.sh .gpu_bundle", carry=[".gpu_bundle.tar.xz", ".whl_e2e"], timeout_s=600)
#                 (the folder is unpacked from .gpu_bundle.tar.xz when it is not there; carry the
#                 folder itself instead only if it is under the 64 MiB carry limit)
#
# Budget (estimates, H200): GPU tests <= 90 s, 1.3B bench ~60-90 s, torch 1.3B ~20 s, 14B c+d+VAE
# ~100-150 s, torch 14B ~60 s, 1.3B switch matrix <= 80 s, 14B stage a ~45 s if more than 100 s are left
# of E2E_BUDGET_S (default 450 s).
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${1:-.gpu_bundle}
OUT=${OUT:-./out}
BUDGET=${E2E_BUDGET_S:-450}
# W8A8 variant of stages b-d: the engine's default (token128, chosen for accuracy) unless set,
# e.g. E2E_INT8_VARIANT=post-scale (the fastest GEMM, less accurate on outliers; docs/benchmarks.md).
VARIANT=${E2E_INT8_VARIANT:-token128}
START=$(date +%s)
mkdir -p "$OUT"
LOG="$OUT/e2e_log.txt"
: > "$LOG"
if [ ! -x "$BUNDLE/turbodiff" ] && [ -f "$BUNDLE.tar.xz" ]; then tar xJf "$BUNDLE.tar.xz"; fi
[ -x "$BUNDLE/turbodiff" ] || { echo "e2e_gpu: no $BUNDLE/turbodiff (build it and pack with scripts/gpu_bundle.sh)" | tee -a "$LOG"; exit 1; }
TD="$BUNDLE/turbodiff"
export PYTHONUNBUFFERED=1
# cuDNN / NVRTC / cuBLAS from PyTorch's wheels when the system has none (as gpu_check.sh).
extra=$(python3 - <<'PY' 2>/dev/null
import importlib, os
dirs = []
for mod in ("nvidia.cudnn", "nvidia.cuda_nvrtc", "nvidia.cublas", "nvidia.cu13"):
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
[ -d "$BUNDLE/lib" ] && export LD_LIBRARY_PATH="$(cd "$BUNDLE/lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# diffusers (not on the GPU image) from the carried wheels: .whl_e2e/ (E2E_WHEELS), else .whl/.
WHEELS=${E2E_WHEELS:-.whl_e2e}
[ -d "$WHEELS" ] || WHEELS=.whl
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl >> "$LOG" 2>&1 \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -c "import diffusers; print('diffusers', diffusers.__version__, diffusers.__file__)" >> "$LOG" 2>&1

elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET - $(elapsed) )); }
step() {  # name timeout cmd...
  local name=$1 to=$2; shift 2
  if [ "$to" -le 20 ]; then echo "== $name: skipped ($(left) s of the budget left)" | tee -a "$LOG"; return; fi
  echo "== $name (limit ${to}s, at $(elapsed)s)" | tee -a "$LOG"
  local s=$(date +%s)
  timeout "$to" "$@" >> "$LOG" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $(( $(date +%s) - s ))s" | tee -a "$LOG"
}
min() { [ "$1" -lt "$2" ] && echo "$1" || echo "$2"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >> "$LOG" 2>&1

# The GPU tests of this work first (patchify, RoPE, random fills, --default-norm, random models, bench e2e tiny):
# a minute at most; skipped when the bundle has no test binary or E2E_SKIP_TESTS=1.
if [ -x "$BUNDLE/turbodiff_gpu_tests" ] && [ "${E2E_SKIP_TESTS:-0}" != 1 ]; then
  export TURBODIFF_SOURCE_DIR=$(pwd) TURBODIFF_CLI=$(pwd)/$BUNDLE/turbodiff
  step "GPU tests (e2e)" 90 "$BUNDLE/turbodiff_gpu_tests" \
    --gtest_filter='PatchifyGpu*:RopeApplyGpu*:RandomFillGpu*:WanDefaultNormGpu*:RandomWanGpu*:BenchE2eGpu*'
  grep -E '^\[  (PASSED|FAILED) |^\[  FAILED  \]' "$LOG" | tail -n 12
fi

step "bench e2e Wan2.1-1.3B 480p, stages a-d" "$(min 170 "$(left)")" \
  "$TD" bench e2e --device cuda --int8-variant "$VARIANT" --model Wan2.1-1.3B --forwards 3 --warmup 1 --profile --json "$OUT/e2e_1.3B.json"
step "torch_e2e 1.3B" "$(min 100 "$(left)")" \
  python3 bench/torch_e2e.py --model 1.3B --forwards 3 --warmup 1 --json "$OUT/torch_e2e_1.3B.json"
# 14B: c and d first (the target), VAE at 720p once; the text encoder is the same umT5-XXL as above.
step "bench e2e Wan2.1-14B 720p, stages c,d" "$(min 170 "$(( $(left) - 90 ))")" \
  "$TD" bench e2e --device cuda --int8-variant "$VARIANT" --model Wan2.1-14B --stages c,d --forwards 2 --warmup 1 --no-sampler --vae-runs 1 \
  --no-text-encoder --profile --json "$OUT/e2e_14B_cd.json"
step "torch_e2e 14B" "$(min 150 "$(( $(left) - 10 ))")" \
  python3 bench/torch_e2e.py --model 14B --forwards 2 --warmup 1 --json "$OUT/torch_e2e_14B.json"
# Issue 7: a forward at Wan-1.3B 480p in every switch combination (float / W8A8 x default / fused norms x
# original / sla / sagesla, no fallback: what cannot run says why in the JSON).
step "bench e2e Wan2.1-1.3B 480p, every switch combination" "$(min 80 "$(( $(left) - 60 ))")" \
  "$TD" bench e2e --device cuda --int8-variant "$VARIANT" --model Wan2.1-1.3B --switches --forwards 2 --warmup 1 \
  --no-vae --no-text-encoder --json "$OUT/e2e_1.3B_switches.json"
# Stage a at 14B (BF16 dense, default norms): one warm-up, one timed forward, only when time is left.
if [ "$(left)" -gt 100 ]; then
  step "bench e2e Wan2.1-14B 720p, stage a" "$(( $(left) - 10 ))" \
    "$TD" bench e2e --device cuda --model Wan2.1-14B --stages a --forwards 1 --warmup 1 --no-vae --no-text-encoder \
    --json "$OUT/e2e_14B_a.json"
else
  echo "== 14B stage a: skipped ($(left) s of the ${BUDGET} s budget left)" | tee -a "$LOG"
fi

python3 - "$OUT" <<'PY' 2>&1 | tee -a "$LOG" | tee "$OUT/e2e_table.txt"
import json, os, sys
out = sys.argv[1]
def load(n):
    p = os.path.join(out, n)
    try:
        return json.load(open(p))
    except Exception as e:
        return None
print(f"{'model':6} {'stage':5} {'attention':18} {'fwd ms':>9} {'diffusion s':>12} {'sampler s':>10} {'total s':>9} {'peak GiB':>9}")
for model, files in (("1.3B", ["e2e_1.3B.json", "e2e_1.3B_switches.json"]), ("14B", ["e2e_14B_a.json", "e2e_14B_cd.json"])):
    for f in files:
        d = load(f)
        if not d:
            print(f"{model:6} {f}: no result"); continue
        for s in d["stages"]:
            if not s["ran"]:
                print(f"{model:6} {s['stage']:5} not run: {json.dumps(s.get('attention_refused'))[:200]}"); continue
            samp = f"{s['sampler_s']:.3f}" if "sampler_s" in s else "-"
            print(f"{model:6} {s['stage']:5} {s['attention']:18} {s['forward_ms']:9.1f} {s['diffusion_s']:12.3f} {samp:>10} "
                  f"{s['total_s']:9.3f} {(s['peak_gpu_bytes'] or 0)/2**30:9.2f}")
        v, t = d.get("vae", {}), d.get("text_encoder", {})
        print(f"{model:6} VAE decode: {v.get('decode_s', v.get('error'))}  text encoder: {t.get('encode_s', t.get('error'))}")
        if "profile" in d:
            p = d["profile"]
            cls = ", ".join(f"{k} {v['ms']:.1f} ms" for k, v in p["classes"].items())
            print(f"{model:6} profile (stage {p['stage']}, {p['forward_ms']:.1f} ms): {cls}")
    t = load(f"torch_e2e_{model}.json")
    if t and "forward_ms" in t:
        print(f"{model:6} torch diffusers BF16 SDPA forward: {t['forward_ms']:.1f} ms (peak {(t['peak_gpu_bytes'] or 0)/2**30:.2f} GiB)")
    else:
        print(f"{model:6} torch: {t.get('skipped') if t else 'no result'}")
PY
echo "e2e_gpu: done in $(elapsed)s; JSON in $OUT" | tee -a "$LOG"
