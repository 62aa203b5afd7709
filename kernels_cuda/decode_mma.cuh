/*
 * The grouped-query decode kernel on tensor cores (included by
 * decode_step.cu; docs/backends.md "Decode on tensor cores"). It does what
 * attend_chunks does for one (chunk, group of up to 16 query heads) of
 * 16-bit rows at d = 64 or 128, but a warp takes 16 rows at a time and
 * computes with mma.sync m16n8k16 (f32 accumulators):
 *
 *   S (16 query heads x 8 rows)  = Q (16 x 16 of d) . K^T (16 of d x 8 rows),
 *                                  d / 16 steps, two row tiles;
 *   O (16 x 8 of d)             += P (16 x 16 rows) . V (16 rows x 8 of d),
 *                                  d / 8 column tiles,
 *
 * with the queries as the M dimension (heads past G are zeros), so that K is
 * read as the B operand in whole 32-bit pairs of a row, and S's accumulator
 * layout is P's operand layout: the probabilities never leave the lane that
 * computed them (FlashAttention-2's arrangement). The online softmax runs
 * per query head on the accumulators, its maximum over the four lanes that
 * share a head's row.
 *
 * Exactness as attend_chunks: the f32 query (scaled by 1 / sqrt(d) and a
 * power of two that puts its largest element near 2^14, undone on S) is
 * split into NS 16-bit parts whose sum is the query to 2^-22 (f16: hi + lo)
 * or 2^-24 (bf16: three parts), and so is P (for f16 times 2^14, so that
 * small probabilities stay above f16's subnormals; undone at the merge); K
 * and V are the cache's values
 * exactly, and a 16-bit product is exact in f32. So S and O carry the f32
 * kernel's precision, up to the order of the sums, and the kept sets match
 * ref's (the gpu suite's cross-check, with the path forced).
 *
 * On CUDA sm_80 and later the mma is the instruction. Elsewhere (HIP-CPU,
 * whose threads are fibers without lanes; or FG_GPU_SHARED_REDUCE) it is
 * emulated from the same fragments: each lane puts its operands in shared
 * memory, and each computes its accumulators from the documented layouts,
 * so the emulation checks every fragment the kernel builds. Real HIP keeps
 * attend_chunks (MFMA and WMMA have other layouts): not compiled there.
 */
#if !defined(FG_HIP) || defined(__HIP_CPU_RT__)
#define FG_DECODE_MMA 1

#define MMA_ROWS 16                 /* rows a warp takes at a time */
#define MMA_WARPS (FG_THREADS / 32) /* warps a block (32 threads: CUDA's warp; HIP-CPU's lanes are notional) */
#define MMA_HEADS 16                /* query heads a block: M */

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(FG_GPU_SHARED_REDUCE)
#define FG_MMA_HW 1
#else
#define FG_MMA_HW 0
#endif

/* 16-bit value <-> float, f16 or bf16 (BF). */
template <int BF> __device__ static inline float mma_to_float(uint32_t bits) {
    return BF ? fg_bf16_to_f32((uint16_t)bits) : fg_f16_to_f32((uint16_t)bits);
}
template <int BF> __device__ static inline uint32_t mma_from_float(float x) {
    return BF ? fg_f32_to_bf16(x) : fg_f32_to_f16(x);
}

/* x as NS 16-bit parts whose sum is x to the format's precision times NS
 * (the residual of each part is exact in f32). Every part has x's sign, so
 * that an infinite K or V element times them sums to what it makes times x
 * in the f32 kernels (parts of both signs would make inf - inf, NaN): each
 * part is rounded toward 0, and one that would be 0 while x is not is the
 * least subnormal of x's sign instead, which moves the sum by 2^-24 of a
 * part's unit, nothing at f32's precision. An infinite x: its other parts
 * are such subnormals. */
template <int BF, int NS> __device__ static inline void mma_split(float x, uint32_t (&part)[NS]) {
    const uint32_t tiny = (fg_f32_bits(x) >> 16 & 0x8000u) | 1u;
    float rest = x;
FG_UNROLL
    for (int s = 0; s < NS; s++) {
        uint32_t b = mma_from_float<BF>(rest);
        if ((b & 0x7fffu) != 0 && fabsf(mma_to_float<BF>(b)) > fabsf(rest)) /* rounded away from 0: one ulp back */
            b -= 1u;
        if ((b & 0x7fffu) == 0 && x != 0.0f) { /* nothing left at this format's precision: tiny parts on */
            part[s] = tiny;
            rest = 0.0f;
            continue;
        }
        part[s] = b;
        const float v = mma_to_float<BF>(b);
        rest = fabsf(v) <= 3.4e38f ? rest - v : 0.0f;
    }
}

/* c += a . b for one warp: a the 16 x 16 operand (4 words a lane), b the
 * 16 x 8 (2 words), c the 16 x 8 accumulators (4 floats), in mma.m16n8k16's
 * fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"): lane L
 * holds a's rows L / 4 and L / 4 + 8 at columns 2 (L % 4) + {0, 1} and the
 * same + 8 (words 0-3: row r col c, row r + 8 col c, row r col c + 8, both
 * + 8), b's column L / 4 at rows 2 (L % 4) + {0, 1} and + 8, c's rows L / 4
 * and + 8 at columns 2 (L % 4) + {0, 1}. A word's low half is the lower
 * column (a) or row (b). xf: the warp's 32 x 6 words of shared memory for
 * the emulation. Every thread of the block calls it (the emulation
 * synchronises). */
template <int BF>
__device__ static inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], uint32_t *xf) {
#if FG_MMA_HW
    (void)xf;
    if constexpr (BF)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    const int lane = (int)(threadIdx.x & 31);
    for (int i = 0; i < 4; i++)
        xf[lane * 6 + i] = a[i];
    xf[lane * 6 + 4] = b[0];
    xf[lane * 6 + 5] = b[1];
    __syncthreads();
    for (int e = 0; e < 4; e++) {
        const int m = (lane >> 2) + (e >> 1) * 8, n = (lane & 3) * 2 + (e & 1);
        float s = 0.0f;
        for (int k = 0; k < 16; k++) {
            const uint32_t aw = xf[((m & 7) * 4 + ((k & 7) >> 1)) * 6 + (m >> 3) + 2 * (k >> 3)];
            const uint32_t bw = xf[(n * 4 + ((k & 7) >> 1)) * 6 + 4 + (k >> 3)];
            s += mma_to_float<BF>((aw >> ((k & 1) * 16)) & 0xffffu) * mma_to_float<BF>((bw >> ((k & 1) * 16)) & 0xffffu);
        }
        c[e] += s;
    }
    __syncthreads();
#endif
}

/* x[0..N) reduced over the four lanes that share L / 4 (a row of the
 * accumulators): their maximum (NaN when any is) or sum. Every thread of the
 * block calls it; sh: N x blockDim.x floats for the shared-memory path. */
template <int N, bool MAX> __device__ static inline void mma_quad_reduce(float (&x)[N], float *sh) {
#if FG_GROUP_SUM_SHARED || !FG_MMA_HW
    const int32_t T = blockDim.x, first = threadIdx.x & ~3u;
    for (int i = 0; i < N; i++)
        sh[i * T + threadIdx.x] = x[i];
    __syncthreads();
    for (int i = 0; i < N; i++) {
        float r = sh[i * T + first];
        for (int32_t j = 1; j < 4; j++)
            r = MAX ? fg_max_nan(r, sh[i * T + first + j]) : r + sh[i * T + first + j];
        x[i] = r;
    }
    __syncthreads();
#else
    (void)sh;
    for (int o = 1; o < 4; o <<= 1)
FG_UNROLL
        for (int i = 0; i < N; i++) {
            const float y = __shfl_xor_sync(0xffffffffu, x[i], o);
            x[i] = MAX ? fg_max_nan(x[i], y) : x[i] + y;
        }
#endif
}

/* Shared memory of attend_mma, in floats after the tile's addresses: the
 * query's fragments, the emulation's exchange, the merge's area. */
__host__ __device__ constexpr int mma_q_words(int ns, int dc) { return ns * dc * 32 * 4; }
__host__ __device__ constexpr int mma_red_floats(int d) {
    return MMA_WARPS * d > 2 * FG_THREADS ? MMA_WARPS * d : 2 * FG_THREADS;
}
__host__ __device__ constexpr int32_t mma_addr_floats(int32_t tile) { /* the addresses, to 16 bytes */
    return (int32_t)((tile * (sizeof(void *) / sizeof(float)) + 3) & ~(size_t)3);
}
static size_t mma_shared_bytes(int ns, int d, int32_t tile) {
    return (size_t)mma_addr_floats(tile) * 4 +
           ((size_t)mma_q_words(ns, d / 16) + MMA_WARPS * 32 * 6 + (size_t)mma_red_floats(d)) * 4;
}

/* Rows whose addresses a block resolves at once: the whole chunk where 48 KB
 * allow, else the most whole rounds (a warp's 16 rows, every warp) that fit. */
static int32_t mma_tile(int32_t chunk, int ns, int d) {
    const int32_t step = MMA_WARPS * MMA_ROWS;
    int32_t tile = chunk;
    while (tile > step && mma_shared_bytes(ns, d, tile) > 48 * 1024)
        tile -= step;
    return tile;
}

/* One block per (chunk, group of up to 16 query heads), as attend_chunks:
 * the same partial states (max, sum, output per query head) and logits. */
template <int BF, int NS, int DC>
__global__ static void FG_BLOCK_BOUNDS attend_mma(fg_gpu_layout L, int32_t G, int32_t tile, const decode_desc *heads,
                                                  const decode_item *items, float *praw, float *part) {
    constexpr int D = DC * 16, NT = D / 8; /* the output's 8-column tiles */
    /* P in f16 times 2^14 (at most 16384): small probabilities keep their precision above f16's
       subnormals (2^-24), and O is 2^14 times the true one until the merge; bf16 has f32's range */
    constexpr float PSCALE = BF ? 1.0f : 16384.0f;
    FG_DYNAMIC_SHARED(float, sh);
    const int32_t n_groups = (G + MMA_HEADS - 1) / MMA_HEADS, item = blockIdx.x / n_groups;
    const decode_item it = items[item];
    const decode_desc h = heads[it.head];
    void *const *pages = h.pages, *const *meta = h.meta;
    const int32_t P = L.page_tokens, T = blockDim.x, W = T / 32;
    const int32_t g0 = (blockIdx.x % n_groups) * MMA_HEADS, GB = fg_imin(MMA_HEADS, G - g0);
    const int32_t lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const int32_t qr = lane >> 2, pc = (lane & 3) * 2; /* the lane's rows of S and O (qr, qr + 8), its column pair */
    const bool track = fg_tracks_scores(h.components);
    const unsigned char **addr = (const unsigned char **)(void *)sh; /* [tile] */
    uint32_t *qf = (uint32_t *)(sh + mma_addr_floats(tile)); /* [NS][DC][32 lanes][4], 16-byte aligned */
    uint32_t *xf = qf + mma_q_words(NS, DC) + warp * 32 * 6;                  /* this warp's exchange */
    float *red = (float *)(qf + mma_q_words(NS, DC) + MMA_WARPS * 32 * 6);    /* mma_red_floats(D) */
    const size_t row_stride = (size_t)D * 2;

    /* the query as fragments: scaled by 1 / sqrt(d), and for f16 by 2^-e that puts its largest element in
       [2^13, 2^14) (f16's range and its precision for small values; S is multiplied back by 2^e) */
    float big = 0.0f;
    for (int32_t i = threadIdx.x; i < GB * D; i += T)
        big = fg_max_nan(big, fabsf(h.q[(size_t)g0 * D + i]));
    big = fg_block_max_nan(big, red) / sqrtf((float)D);
    int e2 = 0;
    if (!BF && big > 0.0f && big <= 3.0e38f) { /* finite and not 0; NaN and inf stay as they are */
        frexpf(big, &e2);
        e2 = e2 - 14 < -100 ? -100 : e2 - 14; /* 2^-e2 stays finite in f32 */
    }
    const float qscale = ldexpf(1.0f / sqrtf((float)D), -e2), sback = ldexpf(1.0f, e2);
    for (int32_t w = threadIdx.x; w < NS * DC * 32 * 2; w += T) { /* a (part, step, lane, row pair) a thread */
        const int32_t s = w / (DC * 64), kc = w / 64 % DC, ln = w / 2 % 32, half = w % 2;
        const int32_t k = kc * 16 + (ln & 3) * 2 + half * 8;
        for (int rr = 0; rr < 2; rr++) { /* words 0 / 1: rows ln / 4 and + 8 (half 1: words 2 / 3) */
            const int32_t m = (ln >> 2) + rr * 8;
            uint32_t p0[NS], p1[NS];
            mma_split<BF, NS>(m < GB ? h.q[(size_t)(g0 + m) * D + k] * qscale : 0.0f, p0);
            mma_split<BF, NS>(m < GB ? h.q[(size_t)(g0 + m) * D + k + 1] * qscale : 0.0f, p1);
            uint32_t word = 0; /* part s (selected, not indexed: the parts stay in registers) */
FG_UNROLL
            for (int x = 0; x < NS; x++)
                word = x == s ? p0[x] | p1[x] << 16 : word;
            qf[((s * DC + kc) * 32 + ln) * 4 + half * 2 + rr] = word;
        }
    }

    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* heads qr and qr + 8 */
    float o[NT][4];
FG_UNROLL
    for (int t = 0; t < NT; t++)
        o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
    for (int32_t t0 = it.begin; t0 < it.end; t0 += tile) {
        const int32_t t1 = t0 + tile < it.end ? t0 + tile : it.end;
        __syncthreads(); /* the previous tile's addresses are used (and, the first time, q is in) */
        for (int32_t r = t0 + (int32_t)threadIdx.x; r < t1; r += T) {
            const int32_t row = *fg_slot_row(&L.pl, meta, r);
            addr[r - t0] = (const unsigned char *)pages[row / P] + (size_t)(row % P) * row_stride;
        }
        __syncthreads();
        const int32_t iters = (t1 - t0 + W * MMA_ROWS - 1) / (W * MMA_ROWS); /* the same for every thread */
        for (int32_t i = 0; i < iters; i++) {
            const int32_t r0 = t0 + (i * W + warp) * MMA_ROWS; /* the warp's 16 rows */
            /* every load of the warp's 16 rows first, K's and V's (8 KB at d = 128, f16): the warps of a
               multiprocessor keep enough bytes in flight to cover the memory's latency. K as S's B operand:
               row r0 + 8 u + qr, columns 16 kc + pc + {0, 1} and + 8. V as the B operand of O's column tile
               t: column 8 t + qr of rows r0 + pc + {0, 1} (word 0) and + 8 (word 1) */
            uint32_t kb[DC][2][2], vb[NT][2];
FG_UNROLL
            for (int u = 0; u < 2; u++) {
                const int32_t r = r0 + u * 8 + qr;
                const unsigned char *kr = r < t1 ? addr[r - t0] + L.k_offset + (size_t)pc * 2 : NULL;
FG_UNROLL
                for (int kc = 0; kc < DC; kc++)
FG_UNROLL
                    for (int x = 0; x < 2; x++)
                        kb[kc][u][x] = kr ? *(const uint32_t *)(kr + (size_t)(kc * 16 + x * 8) * 2) : 0u;
            }
            {
                const unsigned char *vr[4];
FG_UNROLL
                for (int x = 0; x < 4; x++) {
                    const int32_t r = r0 + pc + (x & 1) + (x >> 1) * 8;
                    vr[x] = r < t1 ? addr[r - t0] + L.v_offset + (size_t)qr * 2 : NULL;
                }
FG_UNROLL
                for (int t = 0; t < NT; t++) {
                    uint32_t v16[4];
FG_UNROLL
                    for (int x = 0; x < 4; x++)
                        v16[x] = vr[x] ? *(const uint16_t *)(vr[x] + (size_t)t * 16) : 0u;
                    vb[t][0] = v16[0] | v16[1] << 16;
                    vb[t][1] = v16[2] | v16[3] << 16;
                }
            }
            /* S, row tile u: rows r0 + 8 u + [0, 8) */
            float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
FG_UNROLL
            for (int kc = 0; kc < DC; kc++)
FG_UNROLL
                for (int sp = 0; sp < NS; sp++) {
                    const uint4 aw = *(const uint4 *)(qf + ((sp * DC + kc) * 32 + lane) * 4);
                    const uint32_t a[4] = {aw.x, aw.y, aw.z, aw.w};
FG_UNROLL
                    for (int u = 0; u < 2; u++)
                        mma_16816<BF>(s[u], a, kb[kc][u], xf);
                }
            /* s[u][e]: head qr + 8 (e / 2), row r0 + 8 u + pc + e % 2 */
            float mx[2] = {-INFINITY, -INFINITY};
FG_UNROLL
            for (int u = 0; u < 2; u++)
FG_UNROLL
                for (int e = 0; e < 4; e++) {
                    const int32_t r = r0 + u * 8 + pc + (e & 1), g = qr + (e >> 1) * 8;
                    float x = s[u][e] * sback;
                    if (r < t1) {
                        if (track && g < GB)
                            praw[h.praw + (size_t)(g0 + g) * h.n_slots + r] = x;
                    } else {
                        x = -INFINITY;
                    }
                    s[u][e] = x;
                    mx[e >> 1] = fg_max_nan(mx[e >> 1], x);
                }
            mma_quad_reduce<2, true>(mx, red);
FG_UNROLL
            for (int j = 0; j < 2; j++) {
                const float mn = fg_max_nan(m[j], mx[j]);
                /* as attend_chunks: 1 while every score so far is -inf */
                const float c = mn == -INFINITY ? 1.0f : expf(m[j] - mn);
                l[j] *= c;
FG_UNROLL
                for (int t = 0; t < NT; t++) {
                    o[t][2 * j] *= c;
                    o[t][2 * j + 1] *= c;
                }
                m[j] = mn;
            }
            /* P as the A operand: word w of part sp from row tile w / 2, heads qr + 8 (w % 2) */
            uint32_t pa[NS][4];
FG_UNROLL
            for (int w = 0; w < 4; w++) {
                const int u = w >> 1, j = w & 1;
                uint32_t lo[NS], hi[NS];
                float pv[2];
FG_UNROLL
                for (int x = 0; x < 2; x++) {
                    pv[x] = m[j] == -INFINITY ? 0.0f : expf(s[u][2 * j + x] - m[j]);
                    l[j] += pv[x];
                }
                mma_split<BF, NS>(pv[0] * PSCALE, lo);
                mma_split<BF, NS>(pv[1] * PSCALE, hi);
FG_UNROLL
                for (int sp = 0; sp < NS; sp++)
                    pa[sp][w] = lo[sp] | hi[sp] << 16;
            }
            /* O += P V */
FG_UNROLL
            for (int t = 0; t < NT; t++)
FG_UNROLL
                for (int sp = 0; sp < NS; sp++)
                    mma_16816<BF>(o[t], pa[sp], vb[t], xf);
        }
    }

    /* merge: the lanes' sums of a head, then the warps (as attend_chunks' row groups) */
    mma_quad_reduce<2, false>(l, red);
    float *state = part + ((size_t)item * G + g0) * (D + 2); /* per query head: m, l, acc[d] */
    __syncthreads();
    if ((lane & 3) == 0) {
        red[warp * MMA_HEADS + qr] = m[0];
        red[warp * MMA_HEADS + qr + 8] = m[1];
    }
    __syncthreads();
    float cw[2];
FG_UNROLL
    for (int j = 0; j < 2; j++) {
        const int32_t g = qr + j * 8;
        float M = -INFINITY;
        for (int32_t x = 0; x < W; x++)
            M = fg_max_nan(M, red[x * MMA_HEADS + g]);
        cw[j] = m[j] == -INFINITY ? 0.0f : expf(m[j] - M); /* l's; O's also undoes PSCALE */
        if (warp == 0 && (lane & 3) == 0 && g < GB)
            state[(size_t)g * (D + 2)] = M;
    }
    __syncthreads();
    if ((lane & 3) == 0) {
        red[warp * MMA_HEADS + qr] = l[0] * cw[0];
        red[warp * MMA_HEADS + qr + 8] = l[1] * cw[1];
    }
    __syncthreads();
    if ((int32_t)threadIdx.x < GB) {
        float sum = 0.0f;
        for (int32_t x = 0; x < W; x++)
            sum += red[x * MMA_HEADS + threadIdx.x];
        state[(size_t)threadIdx.x * (D + 2) + 1] = sum;
    }
    for (int32_t g = 0; g < GB; g++) { /* the same for the whole block */
        __syncthreads();
        const bool upper = g >= 8; /* the lane's head qr + 8: o[.][2, 3] (selected, not indexed: registers) */
        const float c = (upper ? cw[1] : cw[0]) * (1.0f / PSCALE);
        if (qr == (g & 7))
FG_UNROLL
            for (int t = 0; t < NT; t++) {
                red[warp * D + t * 8 + pc] = (upper ? o[t][2] : o[t][0]) * c;
                red[warp * D + t * 8 + pc + 1] = (upper ? o[t][3] : o[t][1]) * c;
            }
        __syncthreads();
        for (int32_t x = threadIdx.x; x < D; x += T) {
            float sum = 0.0f;
            for (int32_t y = 0; y < W; y++)
                sum += red[y * D + x];
            state[(size_t)g * (D + 2) + 2 + x] = sum;
        }
    }
}

#endif /* !FG_HIP || HIP-CPU */
