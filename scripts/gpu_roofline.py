#!/usr/bin/env python3
"""The decode attention kernel's expected share of HBM bandwidth, per shape,
from a model of the kernel as kernels_cuda/decode_step.cu launches it, and
beside a device run's measurement when one is given.

    scripts/gpu_roofline.py --gpu h200 --resources RES.md [--measured BENCH.txt]
    scripts/gpu_roofline.py --gpu h200 --prompt

--prompt: profiling's time over prefill attention's instead (profile_stats.cu
and prefill_attention.cu): a (row, key, query head) pair's warp instructions,
shared-memory wavefronts and MUFU instructions counted from the source, over
a multiprocessor's rates; the profiling kernel before and after 2026-12-07
(docs/backends.md "Profiling on the GPU").

RES.md: scripts/gpu-resources.sh's table (registers of each attend_chunks
instantiation for the GPU's architecture). BENCH.txt: bench_decode's output
on that GPU (its full-cache rows and "# kernels" lines). The model, for one
decode step of B sequences x Hkv KV heads x n rows (docs/backends.md):

  bytes    K and V of every row, as the kernel reads them (page tables and the
           per-chunk states are under 1 % at these shapes and left out);
  grid     the host's own choices: lanes a row, query heads a block (GBM), row
           chunks (about 8 blocks a multiprocessor), blocks = chunks x groups;
  occupancy  resident blocks a multiprocessor from registers (the table's),
           the block's dynamic shared memory and the warp slots;
  latency  Little's law: a row group keeps U rows of K and V in flight, so a
           multiprocessor has resident blocks x row groups x U x row bytes in
           flight, against bandwidth x memory latency / multiprocessors
           needed to keep the HBM busy;
  issue    the instructions a lane executes a row (its K and V loads and
           conversions) and a (row, query head) pair (the dot and the output
           FMAs, q from shared memory, the lanes' sum, the softmax), over the
           multiprocessors' issue rate;
  shared   q is read from shared memory for every pair, a word at a time (as
           the PTX shows): the lanes of a row group read neighbouring words
           (one pass of the banks a warp-wide load), or, with
           --q-layout contiguous (the kernel before 2026-12-04), words EPL apart,
           which meet in fewer banks and take as many passes more;
  waves    the last wave's idle share when blocks do not fill whole waves.

  predicted = waves x min(latency, issue, shared), the smallest named as
  the limiter, as a share of the GPU's HBM bandwidth, or of the measured
  probe's when a bench output is given.

The tensor-core kernel (attend_mma, decode_mma.cuh: 16-bit rows, d = 64 or
128, CUDA sm_80 and later; --kernel mma, or both) has its own terms: a warp
takes 16 rows and issues all their K and V loads before its products (16 x
the row's bytes in flight a warp, 8 warps a block, the resident blocks from
its registers); one block per (chunk of 128-row rounds, 16 query heads), so
a row is read once for G <= 16; its issue: a warp's 16 rows cost
2 d / 16 x NS mma for S and d / 8 x NS for O (NS: the query's and P's
16-bit parts, 2 for f16, 3 for bf16), its loads (d / 4 words of K, d / 2
halves of V a lane: 16 rows over 32 lanes), about 60 more (the softmax,
the packing of P), at the schedulers' warp instructions a clock; mma
throughput at 1024 FMA a clock a multiprocessor (m16n8k16: 2048), below
which it is not the limit at these shapes. No shared-memory term: q's
fragments are one 16-byte load a lane a product.

The host's part of a step: the bytes the step uploads, with the page tables
built and copied every step (before 2026-12-07: 16 bytes a page a head) and
kept on the device (8-64 bytes a head: descriptors and chunks; a page's 16
bytes only when one is added), printed per shape (--host). The latencies and issue widths are
  public round figures, not fits: the model is there to be compared with
  measurements, not tuned to them.
"""
import argparse
import math
import re
import sys

THREADS = 256          # FG_THREADS
ROWS_IN_FLIGHT = 4     # decode_step.cu

# Public figures; latency: a DRAM access under load, a round figure from
# published microbenchmarks (override with --latency-ns).
GPUS = {
    # name: arch, units, clock GHz, HBM TB/s, registers/unit, max warps/unit, shared KiB/unit, warp, lane-instr/clk/unit, latency ns
    "h200": ("sm_90", 132, 1.98, 4.8, 65536, 64, 228, 32, 128, 650),
    "h100": ("sm_90", 132, 1.98, 3.35, 65536, 64, 228, 32, 128, 650),
    "a100": ("sm_80", 108, 1.41, 2.04, 65536, 64, 164, 32, 128, 600),
    # one MI250 GCD (a device to HIP): 104 CUs, 4 SIMDs of 512 VGPRs a lane (wave64), 8 waves a SIMD
    "mi250": ("gfx90a", 104, 1.70, 1.6, 4 * 512 * 64, 32, 64, 64, 64, 750),
}
MODELS = {  # bench_decode's shapes: Hq, Hkv, d
    "llama2-7b": (32, 32, 128), "llama3-8b": (32, 8, 128), "g8-32x4": (32, 4, 128), "smollm2-135m": (9, 3, 64),
}
DTYPES = {"f32": 4, "f16": 2, "bf16": 2, "q8_0": 0, "q4_0": 0}
ROW_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}  # bytes an element


def elems_per_lane(d, es):
    epl = 16 // es
    while epl < 32 and d // epl > 32:
        epl *= 2
    while epl > 1 and d % epl:
        epl //= 2
    return epl


def max_heads_per_block(epl):
    return 64 // epl if epl >= 16 else 8


def lane_words(es, epl):
    return epl if es == 0 else max(es * epl // 4, 1)


def rows_in_flight(nw):
    return 1 if nw >= 32 else 2 if nw >= 16 else ROWS_IN_FLIGHT


def launch(G, d, es, rows_total, n_units, cap=4):
    """The host's choices in FG_GPU(decode_step): lanes, EPL, GBM, row groups, U, chunk."""
    epl = elems_per_lane(d, es if es else 4)
    lanes = 1
    while lanes * epl < d:
        lanes *= 2
    gbm = 1
    while gbm < G and gbm < max_heads_per_block(epl) and gbm < cap:
        gbm *= 2
    rg = THREADS // lanes
    step = rg * ROWS_IN_FLIGHT
    c = -(-rows_total // (8 * n_units))
    c = max(1, min(c, 2048))
    chunk = -(-c // step) * step
    return epl, lanes, gbm, rg, rows_in_flight(lane_words(es, epl)), chunk


def shared_bytes(epl, gbm, lanes, tile):
    """attend_shared_bytes: the tile's row addresses, q ([GBM][EPL][lanes]), the merge area."""
    area = max(THREADS * epl, gbm * THREADS)
    return tile * 8 + (gbm * lanes * epl + area) * 4


def attend_tile(chunk, step, epl, gbm, lanes):
    """attend_tile: the whole chunk where 48 KB allow, else the most whole steps that fit."""
    tile, fixed = chunk, shared_bytes(epl, gbm, lanes, 0)
    while tile > step and fixed + tile * 8 > 48 * 1024:
        tile -= step
    return tile


def resident_blocks(gpu, regs, smem):
    arch, units, _, _, regs_unit, warps_unit, smem_kib, warp, _, _ = gpu
    warps = THREADS // warp
    if arch.startswith("sm_"):
        warp_regs = -(-max(regs, 1) * 32 // 256) * 256  # allocated per warp in units of 256
        by_regs = (regs_unit // warp_regs) // warps
    else:  # AMD: VGPRs a lane allocated in granules of 8, a SIMD's 512 shared by its waves
        granule = -(-max(regs, 1) // 8) * 8
        by_regs = (512 // granule) * 4 // warps  # waves a CU (4 SIMDs) over the block's waves
    by_warps = warps_unit // warps
    by_smem = (smem_kib * 1024) // (smem + 1024)
    return max(0, min(by_regs, by_warps, by_smem, 32))


def predict(gpu, regs, model, ctx, batch, dtype, kept=1.0, latency_ns=None, bw_tbs=None, q_layout="transposed",
            units=None, heads_cap=4):
    arch, spec_units, clk, spec_bw, _, _, _, warp, lane_rate, lat = gpu
    bw_tbs, units = bw_tbs or spec_bw, units or spec_units
    Hq, Hkv, d = MODELS[model]
    G, es = Hq // Hkv, DTYPES[dtype]
    n = max(4, math.ceil(kept * ctx))
    heads = batch * Hkv
    epl, lanes, gbm, rg, U, chunk = launch(G, d, es, heads * n, units, heads_cap)
    tile = attend_tile(chunk, rg * ROWS_IN_FLIGHT, epl, gbm, lanes)
    items = heads * -(-n // chunk)
    groups = -(-G // gbm)
    blocks = items * groups
    row_bytes = 2 * d * ROW_BYTES[dtype]  # K and V
    total_bytes = heads * n * row_bytes
    res = resident_blocks(gpu, regs, shared_bytes(epl, gbm, lanes, tile))
    if res == 0:
        return None  # the block does not fit a unit
    slots = res * units
    waves = -(-blocks // slots)
    wave_eff = blocks / (waves * slots)
    # latency: bytes in flight a unit against what the HBM needs
    in_flight = res * rg * U * row_bytes
    needed = bw_tbs * 1e12 * (latency_ns or lat) * 1e-9 / units
    f_lat = min(1.0, in_flight / needed)
    # issue: lane-instructions a row (loads, conversions, the row's address) and a pair (row, query head)
    nw = lane_words(es, epl)
    loads = 2 * max(1, -(-nw // 4)) if es else 2 * epl  # 16-byte loads; quantized: a value at a time
    convert = 0 if es == 4 else 2 * epl
    per_row = loads + convert + 2
    per_pair = 2 * epl + -(-epl // 4) + int(math.log2(lanes)) + 6
    lane_instr = lanes * (groups * per_row + G * per_pair)  # each group's blocks load the row again
    rows_per_s = units * lane_rate * clk * 1e9 / lane_instr
    f_issue = min(1.0, rows_per_s * row_bytes / (bw_tbs * 1e12))
    # shared memory: one pass of the 32 banks a clock a unit; a warp-wide load of q serves the warp's
    # warp / lanes row groups (the same words) and takes lanes / distinct banks passes, and a wave64 at
    # least two
    banks = min(lanes, 32) if q_layout == "transposed" else min(lanes, 32 // math.gcd(epl, 32))
    passes = max(warp // 32, -(-lanes // banks))
    passes_per_pair = epl * passes / max(1, warp // lanes)
    rows_per_s = units * clk * 1e9 / (G * passes_per_pair)
    f_shared = min(1.0, rows_per_s * row_bytes / (bw_tbs * 1e12))
    terms = {"latency": f_lat, "issue": f_issue, "shared": f_shared}
    limit = min(terms, key=terms.get)
    pred = wave_eff * terms[limit]
    if terms[limit] >= 1.0:
        limit = "waves"  # nothing but the last wave's idle share
    return {
        "G": G, "gbm": gbm, "lanes": lanes, "U": U, "blocks": blocks, "res": res, "waves": wave_eff,
        "lat": f_lat, "issue": f_issue, "shared": f_shared, "pred": pred, "limit": limit,
        "bytes": total_bytes,
    }


def attend_registers(table, arch):
    """attend_chunks<ES, EPL, GBM> -> registers, and attend_mma<BF, NS, DC> -> registers under the key
    ("mma", BF, NS, DC), from scripts/gpu-resources.sh's table."""
    regs = {}
    for line in open(table):
        cols = [c.strip() for c in line.split("|")]
        if len(cols) < 6 or cols[3] != arch:
            continue
        m = re.search(r"attend_chunks<(\d+), (\d+), (\d+)>", cols[2])
        if m:
            regs[tuple(int(x) for x in m.groups())] = int(cols[4])
        m = re.search(r"attend_mma<(\d+), (\d+), (\d+)>", cols[2])
        if m:
            regs[("mma",) + tuple(int(x) for x in m.groups())] = int(cols[4])
    return regs


MMA_WARPS, MMA_ROWS, MMA_HEADS = THREADS // 32, 16, 16


def mma_applies(dtype, d):
    return dtype in ("f16", "bf16") and d in (64, 128)


def mma_shared_bytes(ns, d, tile):
    """mma_shared_bytes: the addresses (to 16 bytes), q's fragments, the emulation's exchange, the merge."""
    addr = (tile * 2 + 3) // 4 * 4
    return (addr + ns * (d // 16) * 128 + MMA_WARPS * 32 * 6 + max(MMA_WARPS * d, 2 * THREADS)) * 4


def predict_mma(gpu, regs, model, ctx, batch, dtype, kept=1.0, latency_ns=None, bw_tbs=None, units=None):
    arch, spec_units, clk, spec_bw, _, _, _, warp, lane_rate, lat = gpu
    bw_tbs, units = bw_tbs or spec_bw, units or spec_units
    Hq, Hkv, d = MODELS[model]
    G = Hq // Hkv
    ns = 3 if dtype == "bf16" else 2
    n = max(4, math.ceil(kept * ctx))
    heads = batch * Hkv
    step = MMA_WARPS * MMA_ROWS
    c = max(1, min(-(-heads * n // (8 * units)), 2048))
    chunk = -(-c // step) * step
    tile = chunk
    while tile > step and mma_shared_bytes(ns, d, tile) > 48 * 1024:
        tile -= step
    items = heads * -(-n // chunk)
    groups = -(-G // MMA_HEADS)
    blocks = items * groups
    row_bytes = 2 * d * ROW_BYTES[dtype]
    total_bytes = heads * n * row_bytes
    res = resident_blocks(gpu, regs, mma_shared_bytes(ns, d, tile))
    if res == 0:
        return None
    slots = res * units
    waves = -(-blocks // slots)
    wave_eff = blocks / (waves * slots)
    in_flight = res * MMA_WARPS * MMA_ROWS * row_bytes
    needed = bw_tbs * 1e12 * (latency_ns or lat) * 1e-9 / units
    f_lat = min(1.0, in_flight / needed)
    # warp instructions for a warp's 16 rows: the mma, K words (d / 16 x 4 a lane), V halves (d / 8 x 4) and
    # their packing (d / 8 x 2), the softmax and P's parts (about 60); 16 rows x groups (each group reads them)
    n_mma = (2 * (d // 16) + d // 8) * ns
    instr = n_mma + (d // 16) * 4 + (d // 8) * 6 + 60
    rows_per_s = units * (lane_rate / 32) * clk * 1e9 * MMA_ROWS / (instr * groups)
    f_issue = min(1.0, rows_per_s * row_bytes / (bw_tbs * 1e12))
    mma_per_s = units * clk * 1e9 * 1024 / 2048
    f_mma = min(1.0, mma_per_s / (n_mma * groups) * MMA_ROWS * row_bytes / (bw_tbs * 1e12))
    terms = {"latency": f_lat, "issue": f_issue, "mma": f_mma}
    limit = min(terms, key=terms.get)
    pred = wave_eff * terms[limit]
    if terms[limit] >= 1.0:
        limit = "waves"
    return {
        "G": G, "gbm": min(G, MMA_HEADS), "blocks": blocks, "res": res, "waves": wave_eff, "lat": f_lat,
        "issue": f_issue, "shared": f_mma, "pred": pred, "limit": limit, "bytes": total_bytes,
    }


def host_upload(model, ctx, batch, page_tokens=16, kept=1.0):
    """Bytes a decode step of one layer uploads: (tables built every step, tables kept on the device), for the
    full cache: descriptors (96 bytes a head), chunks (12 bytes each, about 8 blocks a multiprocessor),
    and with host tables two 8-byte entries a page a head; kept tables add 32 bytes a head once a page."""
    Hq, Hkv, d = MODELS[model]
    heads = batch * Hkv
    n = max(4, math.ceil(kept * ctx))
    pages = -(-(n + 1) // page_tokens)
    base = heads * 96 + 12 * min(heads * -(-n // 128), 8 * 132)
    return base + heads * pages * 16, base + heads * 32 / page_tokens


# The prompt's kernels (--prompt): warp instructions a (query row, key, query head) pair, counted from the
# source as the kernels run it (not from SASS), for prefill_attention.cu's prefill_tiles and profile_stats.cu's
# profile_tiles before (one row at a time, both operands of the dot from shared memory) and after
# (2026-12-07: four rows a thread, the query's words 4 at a time). Round figures: expf 8 ALU and one MUFU
# (no fast math), an index division at run time (e / d, e % d) 20.
EXP_ALU, DIV_ALU = 8, 20


def prompt_pair_costs(d, n_windows=2):
    """{kernel: (warp instructions, shared-memory wavefronts (loads and shuffles), MUFU warp instructions)} a pair,
    d <= 128 (BK = 32: 32 rows a block in prefill_tiles, 32 keys x 8 lanes in profile_tiles)."""
    dpl = d // 8
    ks = 8 if dpl < 32 else 4                  # keys a softmax round
    # prefill_tiles: 8 lanes a row, a warp 4 rows; per warp and key: the dot and the output's FMAs with a
    # shared load each, the rescale once a round, the 8 lanes' sum (3 shuffles and adds), mask, max, exp, sum
    fma, lds = 2 * dpl + dpl / ks, 2 * dpl
    alu = 3 + 4 + EXP_ALU * (1 + 1 / ks)
    load = 2 * d * (DIV_ALU + 4) / 32          # a key's K and V words over the block's 32 rows, per warp-pair
    pre = ((fma + lds + 3 + alu) / 4 + load / 32, (lds + 3) / 4 + 2 * d / 32 / 32, (1 + 1 / ks) / 4)
    # a pair's own work in profile_tiles: causal check, exp, scale, sum, age, the windows (a thread a pair)
    own = (6 + EXP_ALU + 2 * n_windows) / 32
    # before: a warp 32 keys x 1 row, both words of every product from shared memory, the loop's count
    old = ((d + 2 * d + d / 4) / 32 + own + d * (DIV_ALU + 2) / 1024, 2 * d / 32 + d / 1024, 1 / 32)
    # after: a warp 32 keys x 4 rows; per 4 words: 4 key loads, 4 16-byte query loads (one address a warp),
    # 16 FMAs; the query tile 4 words a thread (load, scale, store)
    new = ((d / 4) * (4 + 4 + 16 + 1) / 128 + own + (d / 4) * 10 / 1024, (d / 4) * 8 / 128 + d / 4 / 1024, 1 / 32)
    return {"prefill": pre, "profile before": old, "profile after": new}


def prompt_clocks(cost, gpu):
    """A multiprocessor's clocks a pair: the most of issue (4 schedulers, a warp instruction a clock each),
    shared memory (a wavefront a clock) and the MUFU (16 lanes a clock: 2 clocks a warp instruction)."""
    issue, mio, mufu = cost
    per_clk = gpu[8] / gpu[7]                  # warp instructions a clock a unit
    terms = {"issue": issue / per_clk, "shared": mio, "mufu": 2 * mufu}
    limit = max(terms, key=terms.get)
    return terms[limit], limit, terms


def measured(path):
    """(model, ctx, batch, dtype, case) -> step's fraction of the probe, (..., kernel) -> the attend kernel's ms
    (attend_chunks' or attend_mma's, whichever the step ran); the probe (GB/s)
    and the device's multiprocessors, from bench_decode's header."""
    rows, kern, probe, units = {}, {}, None, None
    for line in open(path):
        m = re.search(r"device read bandwidth ([\d.]+) GB/s", line)
        if m:
            probe = float(m.group(1))
        m = re.search(r"\((\d+) SMs", line)
        if m:
            units = int(m.group(1))
        m = re.match(r"# kernels (\S+) (\d+) x(\d+) (\S+) (\S+) \(ms a step\):(.*)", line)
        if m:
            parts = dict(re.findall(r"(\w+) ([\d.]+)", m.group(6).split(";")[0]))
            for kernel, name in (("chunks", "attend"), ("mma", "attend_mma")):  # the kernel the step ran
                if name in parts:
                    kern[(m.group(1), int(m.group(2)), int(m.group(3)), m.group(4), m.group(5), kernel)] = \
                        float(parts[name])
            continue
        f = line.split()
        if len(f) >= 9 and f[0] in MODELS and f[1].isdigit() and f[8].endswith("%"):
            rows[(f[0], int(f[1]), int(f[2]), f[3], f[4])] = float(f[8].rstrip("%")) / 100
    return rows, kern, probe, units


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", choices=sorted(GPUS), required=True)
    ap.add_argument("--resources", help="scripts/gpu-resources.sh output (every table but --prompt's)")
    ap.add_argument("--measured", help="bench_decode's output on that GPU")
    ap.add_argument("--latency-ns", type=float)
    ap.add_argument("--bandwidth", type=float, help="TB/s to take shares of (default: the probe's, else the GPU's)")
    ap.add_argument("--q-layout", choices=("transposed", "contiguous"), default="transposed",
                    help="q in shared memory as the kernel lays it out (contiguous: before 2026-12-04)")
    ap.add_argument("--dtypes", default="f16,f32,q8_0,q4_0")
    ap.add_argument("--heads", type=int, default=4, choices=(1, 2, 4, 8),
                    help="query heads a block at most (FASTGEN_GPU_DECODE_HEADS; default 4)")
    ap.add_argument("--kernel", choices=("chunks", "mma", "both"), default="both",
                    help="attend_chunks, the tensor-core attend_mma (16-bit rows, d = 64 / 128), or both rows")
    ap.add_argument("--host", action="store_true",
                    help="also the bytes a step uploads per shape, page tables built each step and kept")
    ap.add_argument("--prompt", action="store_true",
                    help="only the prompt's kernels: profiling against prefill attention, before and after")
    ap.add_argument("--measured-profile", type=float, default=0.535,
                    help="profile_over_prefill measured before (bench_profile; the H200 run of 2026-12-04)")
    a = ap.parse_args()
    gpu = GPUS[a.gpu]
    if a.prompt:
        if not gpu[0].startswith("sm_"):
            sys.exit(f"gpu_roofline: --prompt counts NVIDIA's warp and MUFU rates; not {a.gpu}")
        print_prompt(gpu, a.gpu, a.measured_profile)
        return
    if not a.resources:
        sys.exit("gpu_roofline: --resources is needed (scripts/gpu-resources.sh's table)")
    regs = attend_registers(a.resources, gpu[0])
    if not regs:
        sys.exit(f"gpu_roofline: no attend_chunks rows for {gpu[0]} in {a.resources}")
    meas, kern, probe, units = measured(a.measured) if a.measured else ({}, {}, None, None)
    bw = a.bandwidth or (probe / 1e3 if probe else None)
    print(f"# {a.gpu}: {units or gpu[1]} units at {gpu[2]} GHz, latency {a.latency_ns or gpu[9]:.0f} ns, q layout {a.q_layout}; "
          f"shares of " + (f"{bw:.2f} TB/s" if bw else f"{gpu[3]} TB/s") + " (scripts/gpu_roofline.py)")
    head = ("| shape | ctx | batch | dtype | kernel | GBM | blocks | blocks/unit | waves | latency | issue | "
            "shared (mma: tensor) | predicted |")
    if meas:
        head += " measured step | measured attend |"
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for model in MODELS:
        for dtype in a.dtypes.split(","):
            for ctx in (1024, 4096, 16384):
                for batch in (1, 8):
                    Hq, Hkv, d = MODELS[model]
                    G, es = Hq // Hkv, DTYPES[dtype]
                    kernels = ["chunks"] if a.kernel in ("chunks", "both") else []
                    if a.kernel in ("mma", "both") and mma_applies(dtype, d) and gpu[0].startswith("sm_"):
                        kernels.append("mma")
                    for kernel in kernels:
                        if kernel == "mma":
                            ns = 3 if dtype == "bf16" else 2
                            r_ = regs.get(("mma", int(dtype == "bf16"), ns, d // 16))
                            if r_ is None:
                                continue
                            p = predict_mma(gpu, r_, model, ctx, batch, dtype, latency_ns=a.latency_ns, bw_tbs=bw,
                                            units=units)
                        else:
                            epl, _, gbm, *_ = launch(G, d, es, batch * Hkv * ctx, units or gpu[1], a.heads)
                            r_ = regs.get((es, epl, gbm))
                            if r_ is None:
                                continue
                            p = predict(gpu, r_, model, ctx, batch, dtype, latency_ns=a.latency_ns, bw_tbs=bw,
                                        q_layout=a.q_layout, units=units, heads_cap=a.heads)
                        if p is None:
                            print(f"| {model} | {ctx} | {batch} | {dtype} | {kernel} | the block does not fit a unit |")
                            continue
                        line = (f"| {model} | {ctx} | {batch} | {dtype} | {kernel} | {p['gbm']} | {p['blocks']} | "
                                f"{p['res']} | {p['waves']:.2f} | {p['lat']:.2f} | {p['issue']:.2f} | "
                                f"{p['shared']:.2f} | **{p['pred']:.2f}** ({p['limit']}) |")
                        if meas:
                            key = (model, ctx, batch, dtype, "full")
                            step = f"{meas[key]:.2f}" if key in meas else "-"
                            att = "-"
                            if key + (kernel,) in kern and probe:
                                att = f"{p['bytes'] / (kern[key + (kernel,)] * 1e-3) / (probe * 1e9):.2f}"
                            line += f" {step} | {att} |"
                        print(line)
    if a.host:
        print()
        print("| shape | ctx | batch | upload a layer's step, tables built each step | tables kept on the device |")
        print("| --- | --- | --- | --- | --- |")
        for model in MODELS:
            for ctx in (1024, 4096, 16384):
                for batch in (1, 8):
                    before, after = host_upload(model, ctx, batch)
                    print(f"| {model} | {ctx} | {batch} | {before / 1024:.1f} KiB | {after / 1024:.2f} KiB |")


def print_prompt(gpu, name, measured_before):
    """Profiling's time over prefill attention's, the same pairs (the causal half of Q K^T), per head dim."""
    print(f"# {name}: the prompt's kernels, a multiprocessor's clocks a (row, key, query head) pair "
          f"(scripts/gpu_roofline.py --prompt); anchored: the measured ratio before ({measured_before}) "
          f"times the model's after / before")
    print("| d | kernel | issue | shared | mufu | clocks a pair (limit) | over prefill | anchored |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for d in (64, 128):
        costs = prompt_pair_costs(d)
        clk = {k: prompt_clocks(c, gpu) for k, c in costs.items()}
        for k in costs:
            t, limit, terms = clk[k]
            ratio = t / clk["prefill"][0]
            anchored = "-"
            if k == "profile after":
                anchored = f"{measured_before * t / clk['profile before'][0]:.2f}"
            elif k == "profile before" and d == 128:  # bench_profile's shape
                anchored = f"{measured_before:.2f} (measured)"
            print(f"| {d} | {k} | {terms['issue']:.2f} | {terms['shared']:.2f} | {terms['mufu']:.2f} | "
                  f"{t:.2f} ({limit}) | {ratio:.2f} | {anchored} |")


if __name__ == "__main__":
    main()
