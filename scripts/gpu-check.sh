#!/usr/bin/env bash
# One command for a machine with a GPU: builds the CUDA backend (HIP where
# there is no nvcc but hipcc), runs the gpu suite against the reference, then
# the three benchmarks on the device, and prints their summary lines.
#
#   bash scripts/gpu-check.sh [--quick]
#
# Environment: BUILD (build folder, default build-gpucheck), FG_MODELS (folder
# with stories260K.bin, tok512.bin, babyllama105.bin and tok105.bin, default
# ../shared/models), CUDA_ARCH
# (default: the device's own, from nvidia-smi; sm_90 on an H200), OFFLOAD_ARCH
# (HIP). Needs meson, ninja and a C compiler; installs nothing. --quick runs
# the benchmarks on fewer shapes.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpucheck}
MODELS=${FG_MODELS:-../shared/models}
QUICK=${1:-}
export PATH="$PATH:/usr/local/cuda/bin:/opt/rocm/bin"
start=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - start )) s)"; }
fail=0

step "machine"
uname -m
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader
fi
for t in cc meson ninja nvcc hipcc; do printf '%-6s %s\n' "$t" "$(command -v $t || echo -)"; done

if command -v nvcc >/dev/null; then
  backend=cuda
  arch=${CUDA_ARCH:-}
  if [ -z "$arch" ] && command -v nvidia-smi >/dev/null; then
    arch=sm_$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
  fi
  arch=${arch:-sm_90}
  opts=(-Dcuda=enabled -Dhip=disabled "-Dcuda-arch=$arch")
elif command -v hipcc >/dev/null; then
  backend=hip
  opts=(-Dcuda=disabled -Dhip=enabled "-Doffload-arch=${OFFLOAD_ARCH:-gfx90a,gfx1030}")
else
  echo "gpu-check: neither nvcc nor hipcc found"; exit 1
fi

step "build ($backend, ${opts[*]})"
if [ ! -f "$BUILD/build.ninja" ]; then
  meson setup "$BUILD" --buildtype=release -Dwerror=true "${opts[@]}" "-Dmodels-dir=$MODELS" || exit 1
fi
ninja -C "$BUILD" || exit 1
"$BUILD/tools/fastgen" version

step "gpu suite (every op, the API, the model, faults, fork, lockstep: $backend against ref)"
meson test -C "$BUILD" --suite gpu --print-errorlogs --num-processes 4 --timeout-multiplier 0.3 || fail=1

bench_args=(--backend "$backend")
[ "$QUICK" = --quick ] && bench_args+=(--quick)
for b in decode profile compact; do
  step "bench_$b ${bench_args[*]}"
  "$BUILD/bench/bench_$b" "${bench_args[@]}" | tee "$BUILD/bench_$b.txt" || fail=1
done

# the step before and after (2026-12-07), on the largest shapes, one group each: the page tables built and
# copied every step (--host-tables) against kept on the device (above), and attend_chunks
# (FASTGEN_GPU_DECODE_MMA=0) against the tensor-core kernel where the device runs it by default
step "before / after: page tables on the host, attend_chunks (bench_decode, 16k x8 f16)"
rm -f "$BUILD/before_decode.txt"
for m in llama2-7b llama3-8b g8-32x4; do
  "$BUILD/bench/bench_decode" --backend "$backend" --model $m --dtypes f16 --context 16384 --batch 8 --host-tables |
    sed 's/^# kernels/# kernels (host tables)/' | tee -a "$BUILD/before_decode.txt" || fail=1
  FASTGEN_GPU_DECODE_MMA=0 "$BUILD/bench/bench_decode" --backend "$backend" --model $m --dtypes f16 --context 16384 \
    --batch 8 | sed 's/^# kernels/# kernels (attend_chunks)/' | tee -a "$BUILD/before_decode.txt" || fail=1
done

# a real model through both decode kernels against ref (SmolLM2 where scripts/get-models.sh fetched it)
smollm2=$(bash scripts/get-models.sh --offline smollm2 2>/dev/null | awk '$1 == "smollm2" { print $2 }' || true)
if [ -n "$smollm2" ] && [ -f "$smollm2" ]; then
  step "SmolLM2 through the $backend decode kernels against ref (scripts/gpu_generate_check.py)"
  python3 scripts/gpu_generate_check.py "$BUILD/tools/fastgen" "$smollm2" --backend "$backend" | tee "$BUILD/generate_check.txt" ||
    fail=1
fi

# the decode kernel against its model (scripts/gpu_roofline.py): registers from this build's compiler
gpu_name=$( (command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1) ||
  (command -v rocm-smi >/dev/null && rocm-smi --showproductname | grep -o 'MI250' | head -n 1) || true)
model_gpu=$(echo "$gpu_name" | tr 'A-Z' 'a-z' | grep -oE 'h200|h100|a100|mi250' | head -n 1 || true)
rm -f "$BUILD/roofline.txt"
if [ -n "$model_gpu" ] && command -v python3 >/dev/null; then
  step "roofline: bench_decode's full-cache cases against the model for $model_gpu"
  # the model's architecture (sm_90 for H100 / H200, sm_80 for A100, gfx90a for MI250), whatever was built
  case $model_gpu in h*) archs=(CUDA_SMS=90 HIP_ARCHS=" ");; a100) archs=(CUDA_SMS=80 HIP_ARCHS=" ");;
    *) archs=(CUDA_SMS=" " HIP_ARCHS=gfx90a);; esac
  # an analysis: a failure here is reported, and does not fail the check
  env "${archs[@]}" bash scripts/gpu-resources.sh "$BUILD" > "$BUILD/resources.md" &&
    python3 scripts/gpu_roofline.py --gpu "$model_gpu" --resources "$BUILD/resources.md" \
      --measured "$BUILD/bench_decode.txt" --dtypes f16 --host > "$BUILD/roofline.txt" && cat "$BUILD/roofline.txt" ||
    { echo "gpu-check: the roofline step failed (above); the check goes on"; rm -f "$BUILD/roofline.txt"; }
  # profiling over prefill attention as the model predicts it, beside bench_profile's measured ratio (summary)
  python3 scripts/gpu_roofline.py --gpu "$model_gpu" --prompt \
    > "$BUILD/roofline_prompt.txt" && cat "$BUILD/roofline_prompt.txt" || rm -f "$BUILD/roofline_prompt.txt"
else
  echo "no roofline: the model knows H200, H100, A100 and MI250 (this GPU: ${gpu_name:-unknown})"
fi

step "summary"
grep -h "summary:" "$BUILD"/bench_*.txt
# where a step goes (per-kernel device times, ms): the largest decode cases and compaction calls
grep -hE "^# kernels .* 16384 x8 f16 full|^# kernels 65536 f(16|32)" "$BUILD"/bench_*.txt
grep -hE "^# kernels .* 16384 x8 f16 full|16384 +8 +f16 full" "$BUILD/before_decode.txt" 2>/dev/null | sed 's/^/(before) /'
[ -f "$BUILD/roofline.txt" ] && grep -E "^\| (llama2-7b|llama3-8b|g8-32x4) \| 16384 \| 8 \|" "$BUILD/roofline.txt"
[ -f "$BUILD/roofline_prompt.txt" ] && grep -E "^\| 128 \| profile after" "$BUILD/roofline_prompt.txt" | sed 's/^/(predicted) /'
echo "gpu-check: $([ $fail = 0 ] && echo passed || echo FAILED) in $(( $(date +%s) - start )) s"
exit $fail
