#!/usr/bin/env bash
# The GPU kernels' resources, per kernel and instantiation, without a device:
# registers, spills and static shared memory from nvcc (-Xptxas -v, sm_80 and
# sm_90) and hipcc (-Rpass-analysis=kernel-resource-usage, gfx90a and
# gfx1030), and the theoretical occupancy they allow: A100 (sm_80), H100 /
# H200 (sm_90, the same SM) for 256-thread blocks (FG_THREADS) from
# registers and static shared memory; MI250 (gfx90a) and RDNA2 (gfx1030)
# as the compiler reports it (waves per SIMD, of 8 and 16).
#
#   scripts/gpu-resources.sh [--check] [BUILD_DIR]
#
# Prints a Markdown table (docs/backends.md sums it up; scripts/gpu_roofline.py
# reads it). --check: exit 1 when any kernel spills or keeps an array in local
# memory / scratch. CI checks the same in its GPU build (-Dgpu-spills=error:
# nvcc's ptxas and kernels_hip/scratch_check.py fail the compile), for sm_90,
# gfx90a and gfx1030. CUDA_SMS (default "80 90") and HIP_ARCHS (default
# "gfx90a gfx1030") choose the architectures; the compiles run in parallel.
# A compiler that is not installed is skipped with a line saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
build=${1:-build}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
hipcc=${HIPCC:-$(command -v hipcc || true)}
inc=(-I. -Iinclude -I"$build/include")
if [ ! -f "$build/include/fastgen_version.h" ] && [ ! -f "$build/include/fastgen_config.h" ]; then
  echo "gpu-resources: $build/include has no generated headers: configure a build first (meson setup $build)" >&2
  exit 2
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# every (source, architecture) compile at once, up to the cores there are
jobs=$(nproc 2>/dev/null || echo 2)
compile() { # log command...
  local log=$1; shift
  "$@" > "$log" 2>&1 || { cat "$log" >&2; echo "gpu-resources: failed: $*" >&2; return 1; }
}
pids=()
for src in kernels_cuda/*.cu; do
  name=$(basename "$src" .cu)
  if [ -x "$nvcc" ]; then
    for sm in ${CUDA_SMS:-80 90}; do
      while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
      compile "$out/$name.sm_$sm.log" "$nvcc" -c "$src" -o "$out/$name.$sm.o" -O3 -std=c++17 -Xcompiler -fPIC \
        "${inc[@]}" -gencode "arch=compute_$sm,code=sm_$sm" -Xptxas -v & pids+=($!)
    done
  fi
  if [ -n "$hipcc" ]; then
    for gfx in ${HIP_ARCHS:-gfx90a gfx1030}; do
      while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
      compile "$out/$name.$gfx.log" "$hipcc" -x hip -c "$src" -o "$out/$name.$gfx.o" -O3 -std=c++17 -fPIC -DFG_HIP \
        -Wno-unused-result "${inc[@]}" --offload-arch=$gfx -Rpass-analysis=kernel-resource-usage & pids+=($!)
    done
  fi
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done # every compile ends before $out goes
[ $failed = 0 ] || exit 1
[ -x "$nvcc" ] || echo "gpu-resources: no nvcc ($nvcc): the CUDA rows are skipped"
[ -n "$hipcc" ] || echo "gpu-resources: no hipcc: the HIP rows are skipped"
python3 - "$out" "$check" <<'EOF'
import glob, os, re, subprocess, sys
out, check = sys.argv[1], sys.argv[2] == "1"

def demangle(names):
    try:
        r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
        return [n.split("(")[0] for n in r.stdout.splitlines()]
    except (OSError, subprocess.CalledProcessError):
        return names

def sm_occupancy(regs, smem, sm):
    """Resident 256-thread blocks x 8 warps / 64 warps, from registers and static shared memory."""
    warp_regs = -(-max(regs, 1) * 32 // 256) * 256
    blocks = min((65536 // warp_regs) // 8, 2048 // 256, 32)
    smem_sm = {80: 164 * 1024, 90: 228 * 1024}.get(sm, 100 * 1024)  # sm_86 / sm_89: 100 KB
    if smem:
        blocks = min(blocks, smem_sm // (smem + 1024))
    return blocks * 8 / 64

rows, spills = [], []
for log in sorted(glob.glob(os.path.join(out, "*.sm_*.log"))):
    src, arch = os.path.basename(log).rsplit(".", 2)[:2]
    sm = int(re.match(r"\d+", arch[3:]).group(0))
    cur = None
    for line in open(log):
        m = re.search(r"Compiling entry function '(\S+)' for", line)
        if m:
            cur = {"name": m.group(1), "spill": 0, "smem": 0, "regs": 0}
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m: # the stack frame holds spills and arrays indexed at run time: local memory either way
            cur["spill"] = max(int(m.group(1)), int(m.group(2)) + int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["regs"] = int(m.group(1))
            m2 = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(m2.group(1)) if m2 else 0
            rows.append((src, arch, cur))
            cur = None
for log in sorted(glob.glob(os.path.join(out, "*.gfx*.log"))):
    src, arch = os.path.basename(log).rsplit(".", 2)[:2]
    cur = None
    for line in open(log):
        m = re.search(r"remark: Function Name: (\S+)", line)
        if m:
            cur = {"name": m.group(1), "spill": 0, "smem": 0, "regs": 0, "occ": 0}
            rows.append((src, arch, cur))
            continue
        if cur is None:
            continue
        for key, field in (("VGPRs", "regs"), ("LDS Size \\[bytes/block\\]", "smem"),
                           ("Occupancy \\[waves/SIMD\\]", "occ")):
            m = re.search(r"remark:\s+" + key + r": (\d+)", line)
            if m:
                cur[field] = int(m.group(1))
        m = re.search(r"remark:\s+ScratchSize \[bytes/lane\]: (\d+)", line)
        if m: # memory per lane: spilled VGPRs and private arrays (SGPR spills go to VGPR lanes, not memory)
            cur["spill"] = int(m.group(1))

names = demangle([r[2]["name"] for r in rows])
print("| source | kernel | arch | registers | local memory bytes (NVIDIA: stack frame or spill stores + loads; AMD: scratch a lane) | static shared bytes | occupancy |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for (src, arch, k), name in zip(rows, names):
    if arch.startswith("sm_"):
        occ = sm_occupancy(k["regs"], k["smem"], int(re.match(r"\d+", arch[3:]).group(0)))
        occ_s = f"{occ:.0%} (256-thread blocks)"
    else:
        most = 8 if arch == "gfx90a" else 16
        occ_s = f"{k['occ']}/{most} waves per SIMD"
    print(f"| {src} | {name} | {arch} | {k['regs']} | {k['spill']} | {k['smem']} | {occ_s} |")
    if k["spill"]:
        spills.append(f"{src}: {name} ({arch}) uses {k['spill']} bytes of local memory")
for s in spills:
    print("spill:", s, file=sys.stderr)
print(f"\n{len(rows)} kernel instantiations, {len(spills)} using local memory (spills or indexed arrays)")
sys.exit(1 if check and spills else 0)
EOF
