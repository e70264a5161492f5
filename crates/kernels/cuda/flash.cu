// flash.cu: tiled attention on tensor cores over the paged cache (the `flash` backend's
// prefill kernel), in the FlashAttention-2 manner.
//
// Inputs are `paged_attention_bf16`'s (see attention.cu): q [t, h, d], the pools
// [blocks, block_size, h_kv, d], cu_seqlens_q, seq_lens and block_tables, plus
// `tiles [seqs + 1]`: the first tile of each sequence (tiles never span two sequences), so
// block x of the grid knows its sequence by a binary search; null when each sequence is
// one tile (decode steps: no upload, so a CUDA graph can hold the launch).
//
// The rows of a sequence and KV head are its (query, head) pairs, query-major: packed row
// P is query P / G of query head kvh * G + P % G, where G = h / h_kv. The heads of a group
// share every key, so they share a tile: a decode step's G rows fill one warp's operand, and
// a prefill tile reads each key once for G heads.
// A block of FL_WARPS warps owns FL_BM = 16 * FL_WARPS packed rows of one sequence and one
// KV head; warp w owns rows 16w .. 16w + 15. The block walks the keys its rows can see in
// tiles of FL_BN: K and V tiles are copied from the pools to shared memory with cp.async
// (two buffers: the next tile loads while this one is used), S = Q Kᵀ and O += P V run as
// mma.sync m16n8k16 (bf16 in, f32 accumulate), and the softmax is online in f32 per row.
// P is rounded to bf16 for its product with V, as FlashAttention does. Warps whose rows are
// all past the tile's end (a decode step's tile has G rows) only help load.
//
// Shared rows are stored with their 16-byte chunks XOR-swizzled by the row index, so the
// eight rows an ldmatrix reads at one column fall in eight different banks.
//
// An e4m3 pool (`Kv8`, attention.cu) fills the same bf16 tiles: cp.async cannot widen, so
// each thread loads its share of the next tile's bytes into registers before this tile's
// products and widens them into the other buffer after, which keeps the loads in flight
// while the tensor cores run. The keys' scale is in `a.scale`, the values' in `a.v_scale`.

#define FL_WARPS 4
#define FL_BM (16 * FL_WARPS)
#define FL_BN 64

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// Copies 16 bytes global -> shared; with `valid` false it writes zeros and reads nothing.
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
// Loads 16 bytes from shared address `src`.
__device__ __forceinline__ uint4 ld_shared16(u32 src) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(src)
                 : "memory");
    return v;
}
// Stores 16 bytes at shared address `dst`.
__device__ __forceinline__ void st_shared16(u32 dst, uint4 v) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// A cp.async pipeline over `k_tiles` tiles in STAGES buffers (the grouped GEMMs', LoRA's):
// `load(kt, stage)` requests tile kt into a buffer, `step(kt, stage)` consumes it. Each
// step's barrier lets the buffer read one tile ago be refilled. Ends with every copy landed.
template <int STAGES, typename Load, typename Step>
__device__ __forceinline__ void cp_async_pipeline(u32 k_tiles, Load&& load, Step&& step) {
#pragma unroll
    for (u32 st = 0; st < STAGES - 1; ++st) {
        if (st < k_tiles) load(st, st);
        cp_async_commit();
    }
    for (u32 kt = 0; kt < k_tiles; ++kt) {
        const u32 st = kt % STAGES;
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const u32 next = kt + STAGES - 1;
        if (next < k_tiles) load(next, next % STAGES);
        cp_async_commit();
        step(kt, st);
    }
    cp_async_wait<0>();
}

__device__ __forceinline__ void ldmatrix_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// c += a · b for one m16n8k16 tile: bf16 operands, f32 accumulators.
__device__ __forceinline__ void mma_bf16(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x by the hardware's approximation (2 ulp; 2^-inf = 0), as `__expf` uses.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Byte offset of chunk `c` (16 bytes) of row `r` in a tile of rows of D bf16.
template <int D>
__device__ __forceinline__ u32 swz(u32 r, u32 c) {
    return r * (D * 2) + ((c ^ (r & 7)) << 4);
}

// grid (total tiles, h_kv), block FL_WARPS * 32, dynamic shared memory (FL_BM + 4 FL_BN) D * 2
// bytes. D is 64 or 128 (head dim 256 prefills on Hopper's warpgroup kernel, `flash_wgmma.cu`).
template <int D, typename KV>
__device__ void flash_prefill(bf16_t* out, const bf16_t* q, const typename KV::T* kc, const typename KV::T* vc,
                              const u32* cu_q, const u32* seq_lens, const u32* tables, const u32* tiles,
                              const AttnArgs& a) {
    extern __shared__ __align__(128) unsigned char fl_smem[];
    constexpr u32 CH = D / 8;  // 16-byte chunks per row
    const u32 qs = smem_addr(fl_smem);
    // Buffer `b` (0 or 1) of the key and of the value tiles.
    auto ks = [&](u32 b) { return qs + (FL_BM + b * FL_BN) * D * 2; };
    auto vs = [&](u32 b) { return qs + (FL_BM + (2 + b) * FL_BN) * D * 2; };
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 kvh = blockIdx.y, G = a.h / a.h_kv;

    // Without `tiles` every sequence is one tile (a decode step of G <= FL_BM rows each).
    // Blocks run in reverse: a sequence's last tiles see the most keys, and starting them
    // first keeps the GPU from ending on a few long blocks.
    const u32 bx = gridDim.x - 1 - blockIdx.x;
    const u32 s = tiles ? seq_of_row(tiles, a.num_seqs, bx) : bx;
    const u32 q_len = cu_q[s + 1] - cu_q[s], ctx = seq_lens[s];
    const u32 p0 = tiles ? (bx - tiles[s]) * FL_BM : 0;  // first packed row of the tile
    if (p0 >= q_len * G) return;                       // (the host sizes the grid exactly)
    const u32 rows = min((u32)FL_BM, q_len * G - p0);
    const u32 base = ctx - q_len;  // position of query index 0
    const u32* table = tables + (u64)s * a.max_blocks;
    // Packed row r of the tile: its q/out row and its position.
    auto row_of = [&](u32 r) { return ((u64)cu_q[s] + (p0 + r) / G) * a.h + kvh * G + (p0 + r) % G; };

    // Keys any row of the tile sees: from the first row's window start to the last row.
    const u32 pos_first = base + p0 / G, pos_last = base + (p0 + rows - 1) / G;
    const u32 lo = (a.window > 0 && pos_first + 1 > a.window) ? pos_first + 1 - a.window : 0;
    const u32 kt_begin = lo / FL_BN, kt_end = pos_last / FL_BN + 1;

    // Q tile -> shared (rows past the sequence are zeros).
    for (u32 c = threadIdx.x; c < FL_BM * CH; c += blockDim.x) {
        const u32 r = c / CH, ch = c % CH;
        const bool valid = r < rows;
        const bf16_t* src = q + row_of(valid ? r : 0) * D + ch * 8;
        cp_async16(qs + swz<D>(r, ch), src, valid);
    }
    // Chunk c of a K/V tile (8 elements): the pool element of its first, or false for keys
    // past the tile's rows (zeros).
    auto chunk_at = [&](u32 kt, u32 c, u64& at) {
        const u32 r = c / CH, ch = c % CH;
        const u32 j = kt * FL_BN + r;
        const bool valid = j <= pos_last;
        const u64 slot = kv_slot(table, valid ? j : pos_last, a.block_size);
        at = (slot * a.h_kv + kvh) * D + ch * 8;
        return valid;
    };
    // bf16 pools: tile kt straight into buffer `buf`.
    auto load_kv = [&](u32 kt, u32 buf) {
        for (u32 c = threadIdx.x; c < FL_BN * CH; c += blockDim.x) {
            u64 at;
            const bool valid = chunk_at(kt, c, at);
            cp_async16(ks(buf) + swz<D>(c / CH, c % CH), kc + at, valid);
            cp_async16(vs(buf) + swz<D>(c / CH, c % CH), vc + at, valid);
        }
    };
    // e4m3 pools: this thread's chunks of tile kt into registers, then widened into `buf`.
    constexpr u32 PER = KV::FP8 ? FL_BN * CH / (FL_WARPS * 32) : 1;
    uint2 k8[PER], v8[PER];
    auto fetch_kv8 = [&](u32 kt) {
#pragma unroll
        for (u32 i = 0; i < PER; ++i) {
            u64 at;
            const bool valid = chunk_at(kt, threadIdx.x + i * FL_WARPS * 32, at);
            k8[i] = valid ? *reinterpret_cast<const uint2*>(kc + at) : make_uint2(0, 0);
            v8[i] = valid ? *reinterpret_cast<const uint2*>(vc + at) : make_uint2(0, 0);
        }
    };
    auto stash_kv8 = [&](u32 buf) {
#pragma unroll
        for (u32 i = 0; i < PER; ++i) {
            const u32 c = threadIdx.x + i * FL_WARPS * 32;
            st_shared16(ks(buf) + swz<D>(c / CH, c % CH), e4m3x8_to_bf16(k8[i]));
            st_shared16(vs(buf) + swz<D>(c / CH, c % CH), e4m3x8_to_bf16(v8[i]));
        }
    };
    if constexpr (KV::FP8) {
        fetch_kv8(kt_begin);
        stash_kv8(0);
    } else {
        load_kv(kt_begin, 0);
    }
    cp_async_commit();

    // This thread's rows: g and g + 8 of the warp's 16.
    const u32 g = lane >> 2, tq = lane & 3;
    u32 pos_r[2], first_r[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const u32 r = min(warp * 16 + g + 8 * i, rows - 1);  // rows past the end mirror the last
        pos_r[i] = base + (p0 + r) / G;
        first_r[i] = (a.window > 0 && pos_r[i] + 1 > a.window) ? pos_r[i] + 1 - a.window : 0;
    }

    u32 qf[D / 16][4];
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-MET_INF, -MET_INF}, l[2] = {0.0f, 0.0f};
    const float log2e = 1.4426950408889634f, scale2 = a.scale * log2e;

    for (u32 kt = kt_begin; kt < kt_end; ++kt) {
        const u32 buf = (kt - kt_begin) & 1;
        if (kt + 1 < kt_end) {
            if constexpr (KV::FP8) fetch_kv8(kt + 1);
            else load_kv(kt + 1, buf ^ 1);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (warp * 16 < rows) {
            if (kt == kt_begin) {
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk) {
                    const u32 r = warp * 16 + (lane & 15), ch = kk * 2 + (lane >> 4);
                    ldmatrix_x4(qs + swz<D>(r, ch), qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);
                }
            }
            // S = Q Kᵀ for the warp's 16 rows and the tile's FL_BN keys.
            float sc[FL_BN / 8][4];
#pragma unroll
            for (int n = 0; n < FL_BN / 8; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
                for (int n = 0; n < FL_BN / 8; n += 2) {
                    const u32 r = n * 8 + (lane & 7) + ((lane >> 4) << 3), ch = kk * 2 + ((lane >> 3) & 1);
                    u32 b0, b1, b2, b3;
                    ldmatrix_x4(ks(buf) + swz<D>(r, ch), b0, b1, b2, b3);
                    mma_bf16(sc[n], qf[kk], b0, b1);
                    mma_bf16(sc[n + 1], qf[kk], b2, b3);
                }
            }
            // Scale, soft-cap, mask; the online softmax in base 2.
            float tile_max[2] = {-MET_INF, -MET_INF};
            // Only tiles that cross a row's causal edge or window start need the mask.
            const u32 key0 = kt * FL_BN;
            const bool edge = key0 + FL_BN - 1 > min(pos_r[0], pos_r[1]) || key0 < max(first_r[0], first_r[1]);
#pragma unroll
            for (int n = 0; n < FL_BN / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = e >> 1;
                    const u32 j = kt * FL_BN + n * 8 + 2 * tq + (e & 1);
                    float x = sc[n][e] * scale2;
                    if (a.softcap > 0.0f) x = a.softcap * tanhf(sc[n][e] * a.scale / a.softcap) * log2e;
                    bool seen = !edge || (j <= pos_r[i] && j >= first_r[i]);
#ifdef MET_FAULT_DROP_LAST_KV_BLOCK
                    // The precision gate's deliberate bug (see `paged_attention_bf16`).
                    const u32 last_start = (ctx - 1) / a.block_size * a.block_size;
                    if (last_start > first_r[i] && j >= last_start && j <= pos_r[i]) seen = false;
#endif
                    x = seen ? x : -MET_INF;
                    sc[n][e] = x;
                    tile_max[i] = fmaxf(tile_max[i], x);
                }
            }
            float corr[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
                tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
                const float m_new = fmaxf(m[i], tile_max[i]);
                // A row that has seen no key yet keeps its zeros: no NaN from -inf - -inf.
                corr[i] = m_new == -MET_INF ? 1.0f : fast_exp2(m[i] - m_new);
                m[i] = m_new;
                l[i] *= corr[i];
            }
            u32 pf[FL_BN / 16][4];
#pragma unroll
            for (int n = 0; n < FL_BN / 8; ++n) {
                float p[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = e >> 1;
                    p[e] = m[i] == -MET_INF ? 0.0f : fast_exp2(sc[n][e] - m[i]);
                }
                // The sum runs over the rounded weights, the ones that multiply V.
                const u32 lo2 = pack_bf16(p[0], p[1]), hi2 = pack_bf16(p[2], p[3]);
                l[0] += bf2f((bf16_t)(lo2 & 0xffff)) + bf2f((bf16_t)(lo2 >> 16));
                l[1] += bf2f((bf16_t)(hi2 & 0xffff)) + bf2f((bf16_t)(hi2 >> 16));
                pf[n / 2][(n & 1) * 2] = lo2;
                pf[n / 2][(n & 1) * 2 + 1] = hi2;
            }
            // Once the row maxima settle, most tiles move none of the warp's: skip the
            // multiplications by 1.
            if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
                for (int n = 0; n < D / 8; ++n) {
                    o[n][0] *= corr[0];
                    o[n][1] *= corr[0];
                    o[n][2] *= corr[1];
                    o[n][3] *= corr[1];
                }
            }
            // O += P V: P's accumulator layout is the A operand's, two key tiles at a time.
#pragma unroll
            for (int kk = 0; kk < FL_BN / 16; ++kk) {
                const u32 a_frag[4] = {pf[kk][0], pf[kk][1], pf[kk][2], pf[kk][3]};
#pragma unroll
                for (int n = 0; n < D / 8; n += 2) {
                    const u32 r = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), ch = n + (lane >> 4);
                    u32 b0, b1, b2, b3;
                    ldmatrix_x4_trans(vs(buf) + swz<D>(r, ch), b0, b1, b2, b3);
                    mma_bf16(o[n], a_frag, b0, b1);
                    mma_bf16(o[n + 1], a_frag, b2, b3);
                }
            }
        }
        if constexpr (KV::FP8) {
            if (kt + 1 < kt_end) stash_kv8(buf ^ 1);  // read last in the tile before this one
        }
        __syncthreads();  // the buffer is refilled two tiles on
    }
    cp_async_wait<0>();

    // The row sums are split over the four threads of a row: add them, then normalise.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const u32 r = warp * 16 + g + 8 * i;
        if (r >= rows) continue;
        const float inv = a.v_scale / l[i];
        u32* dst = reinterpret_cast<u32*>(out + row_of(r) * D);
#pragma unroll
        for (int n = 0; n < D / 8; ++n) dst[n * 4 + tq] = pack_bf16(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
    }
}

#define MET_FLASH_PREFILL(NAME, D, KV)                                                                          \
    extern "C" __global__ void __launch_bounds__(FL_WARPS * 32)                                                 \
        NAME(bf16_t* out, const bf16_t* q, const KV::T* kc, const KV::T* vc, const u32* cu_q, const u32* seq_lens, \
             const u32* tables, const u32* tiles, AttnArgs a) {                                                 \
        pdl_enter();                                                                                            \
        flash_prefill<D, KV>(out, q, kc, vc, cu_q, seq_lens, tables, tiles, a);                                 \
    }
MET_FLASH_PREFILL(flash_prefill_bf16_d64, 64, Kv16)
MET_FLASH_PREFILL(flash_prefill_bf16_d128, 128, Kv16)
MET_FLASH_PREFILL(flash_prefill_e4m3_d64, 64, Kv8)
MET_FLASH_PREFILL(flash_prefill_e4m3_d128, 128, Kv8)
