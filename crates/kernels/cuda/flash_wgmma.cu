// flash_wgmma.cu: the `flash` backend's prefill kernel on Hopper's warpgroup MMA (`wgmma`,
// sm_90a), in the FlashAttention-3 manner: a producer warpgroup feeds tiles to consumer
// warpgroups through a ring of shared-memory stages.
//
// Inputs, grid and the packing of rows are `flash_prefill`'s (flash.cu): the rows of a
// sequence and KV head are its (query, head) pairs, query-major, so a tile reads each key
// once for the G = h / h_kv query heads of the group; `tiles [seqs + 1]` is each sequence's
// first tile (null when every sequence is one tile), in tiles of FW_BM rows.
//
// A block is FW_CONSUMERS warpgroups of 4 warps, each owning 64 packed rows (FW_BM = 128 a
// block), and a producer warpgroup (the last), which gives most of its registers to the
// consumers (`setmaxnreg`). The producer copies the K and V tiles of FW_BN keys the block's
// rows can see from the pools into a ring of FW_STAGES shared-memory stages with cp.async;
// each stage has a `full` mbarrier (every producer thread's copies landed) and an `empty`
// one (every consumer warp is done with it). Per tile, a consumer warpgroup computes
// S = Q Kᵀ with wgmma (Q and K read from shared memory), the online softmax in f32 in
// registers (P rounded to bf16, as in flash.cu), and O += P V with wgmma (P from registers,
// V from shared memory as the transposed operand). The warpgroups meet only at the ring, so
// one's softmax overlaps the other's products, and a warpgroup issues the next tile's Q Kᵀ
// right after this tile's P V, so the tensor cores run both back to back. (Strict turns
// between the warpgroups, FlashAttention-3's ping-pong, measured 1.4 % slower here.)
//
// Over e4m3 pools (`Kv8`, attention.cu) the producer's cp.async copies bring the pools' bytes
// into RAW staging buffers instead (cp.async cannot widen); each producer thread then widens
// the chunks it copied itself (so no producer waits on another) into the stage's bf16 tiles
// (exact: e4m3 is a subset of bf16), fences them for the async proxy and arrives, and
// requests the bytes of the tile RAW ahead. The consumers are unchanged; the keys' scale is
// in `a.scale`, the values' in `a.v_scale`. The stages and staging buffers per head dim are
// `MET_FLASH_PREFILL_WG`'s, to fit 227 KiB.
//
// Shared tiles are laid out as wgmma's 128-byte swizzle reads them: a tile of R rows of D
// bf16 is D / 64 column blocks, each R rows of 128 bytes, and in every 1024-byte group of 8
// rows chunk c (16 bytes) of row r sits at c ^ (r & 7). Q and K are K-major operands; V,
// stored the same way, is the MN-major B operand of P V.

#define FW_CONSUMERS 2
#define FW_BM (64 * FW_CONSUMERS)
#define FW_BN 128
#define FW_STAGES 3
#define FW_THREADS (128 * FW_CONSUMERS + 128)
// Registers per thread after the hand-over: 40 + 2 * 232 of the 512 a thread slot of each
// SM sub-partition has (one warp of each warpgroup).
#define FW_PRODUCER_REGS 40
#define FW_CONSUMER_REGS 232

// Byte offset of chunk `c` (16 bytes) of row `r` in a swizzled tile of R rows.
template <u32 R>
__device__ __forceinline__ u32 fw_off(u32 r, u32 c) {
    return (c >> 3) * (R * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}

// A wgmma shared-memory descriptor with the 128-byte swizzle: `lbo` is the byte offset
// between column blocks of an MN-major operand (K-major operands ignore it), `sbo` between
// groups of 8 rows.
__device__ __forceinline__ u64 wg_desc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr & 0x3ffffu) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving uses of accumulator registers across a wgmma wait.
template <int N>
__device__ __forceinline__ void wg_pin(float* d) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Orders this thread's view of shared memory (written by cp.async) before the async proxy's
// reads (wgmma).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" ::"r"(bar) : "memory");
}
// Arrives on `bar` once this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void mbar_arrive_copies(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
// Waits until the phase of `bar` with parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done = 0;
    while (!done) {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    }
}

// d[64] (+)= A·Bᵀ, m64n128k16: A and B in shared memory (descriptors), both K-major. The
// product accumulates unless `accumulate` is 0.
__device__ __forceinline__ void wgmma_ss_n128(float* d, u64 a, u64 b, u32 accumulate) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0; }"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(accumulate));
}

// d[32] (+)= A·Bᵀ, m64n64k16: A and B in shared memory (descriptors), both K-major. The
// product accumulates unless `accumulate` is 0.
__device__ __forceinline__ void wgmma_ss_n64(float* d, u64 a, u64 b, u32 accumulate) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0; }"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(accumulate));
}

// d[64] += A·B, m64n128k16: A in registers (each warp's 16 rows as mma.sync's A fragment),
// B in shared memory, MN-major.
__device__ __forceinline__ void wgmma_rs_n128(float* d, const u32* a, u64 b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, 1, 1, 1, 1;"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// d[32] += A·B, m64n64k16: A in registers (each warp's 16 rows as mma.sync's A fragment),
// B in shared memory, MN-major.
__device__ __forceinline__ void wgmma_rs_n64(float* d, const u32* a, u64 b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, 1, 1, 1, 1;"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// The kernels exist on sm_90a only (wgmma and setmaxnreg); other targets compile empty
// bodies that the host never launches (`prefill_kernel` in src/cuda/attention.rs).
// grid (total tiles, h_kv), block FW_THREADS, dynamic shared memory as `prefill_kernel` sizes
// it (src/cuda/attention.rs): the Q tile, STAGES stages of a K and a V tile, the mbarriers,
// and 1 KiB to align the tiles to the swizzle's 1024-byte pattern. D is 64 or 128 with tiles
// of FW_BN keys in FW_STAGES stages, or 256 with tiles of 64 keys in 2 stages (a warpgroup's
// 64 rows of O are then 128 registers a thread, and the ring is what 227 KiB hold).
template <int D, int BN, int STAGES, typename KV, int RAW>
__device__ void flash_prefill_wg(bf16_t* out, const bf16_t* q, const typename KV::T* kc, const typename KV::T* vc,
                                 const u32* cu_q, const u32* seq_lens, const u32* tables, const u32* tiles,
                                 const AttnArgs& a) {
    extern __shared__ __align__(1024) unsigned char fw_smem[];
    constexpr u32 CH = D / 8;                // 16-byte chunks per row
    constexpr u32 TILE = BN * D * 2;      // bytes of a K or a V tile
    constexpr u32 RAW_TILE = BN * D;      // bytes of an e4m3 K or V tile
    const u32 qs = (smem_addr(fw_smem) + 1023) & ~1023u;
    auto ks = [&](u32 st) { return qs + FW_BM * D * 2 + 2 * st * TILE; };
    auto vs = [&](u32 st) { return ks(st) + TILE; };
    // e4m3 staging buffer b (K, then V), past the stages.
    auto raw_k = [&](u32 b) { return qs + FW_BM * D * 2 + 2 * STAGES * TILE + 2 * b * RAW_TILE; };
    auto raw_v = [&](u32 b) { return raw_k(b) + RAW_TILE; };
    const u32 bars = qs + FW_BM * D * 2 + 2 * STAGES * TILE + 2 * RAW * RAW_TILE;
    auto full = [&](u32 st) { return bars + 8 * st; };
    auto empty = [&](u32 st) { return bars + 8 * (STAGES + st); };
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 kvh = blockIdx.y, G = a.h / a.h_kv;

    // Longest tiles first, as in flash.cu.
    const u32 bx = gridDim.x - 1 - blockIdx.x;
    const u32 s = tiles ? seq_of_row(tiles, a.num_seqs, bx) : bx;
    const u32 q_len = cu_q[s + 1] - cu_q[s], ctx = seq_lens[s];
    const u32 p0 = tiles ? (bx - tiles[s]) * FW_BM : 0;  // first packed row of the tile
    if (p0 >= q_len * G) return;                       // (the host sizes the grid exactly)
    const u32 rows = min((u32)FW_BM, q_len * G - p0);
    const u32 base = ctx - q_len;  // position of query index 0
    const u32* table = tables + (u64)s * a.max_blocks;
    const u32 pos_first = base + p0 / G, pos_last = base + (p0 + rows - 1) / G;
    const u32 lo = (a.window > 0 && pos_first + 1 > a.window) ? pos_first + 1 - a.window : 0;
    const u32 kt_begin = lo / BN, n_tiles = pos_last / BN + 1 - kt_begin;
    const u32 consumers = (rows + 63) / 64;  // warpgroups with rows; the others leave

    if (threadIdx.x == 0) {
        for (u32 st = 0; st < STAGES; ++st) {
            mbar_init(full(st), 128);
            mbar_init(empty(st), 4 * consumers);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp >= 4 * FW_CONSUMERS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(FW_PRODUCER_REGS));
        const u32 tid = threadIdx.x & 127;
        if constexpr (KV::FP8) {
            // RCH threads copy a row's 16-byte chunks of bytes, 128 / RCH rows a pass.
            constexpr u32 RCH = D / 16, PASS = 128 / RCH;
            const u32 sub = tid / RCH, ch = tid % RCH;
            auto copy = [&](u32 t) {
                const u32 key0 = (kt_begin + t) * BN, b = t % RAW;
                for (u32 r = sub; r < BN; r += PASS) {
                    const u32 j = key0 + r;
                    const bool valid = j <= pos_last;
                    const u64 slot = kv_slot(table, valid ? j : pos_last, a.block_size);
                    const u64 at = (slot * a.h_kv + kvh) * D + ch * 16;
                    cp_async16(raw_k(b) + (r * RCH + ch) * 16, kc + at, valid);
                    cp_async16(raw_v(b) + (r * RCH + ch) * 16, vc + at, valid);
                }
            };
#pragma unroll
            for (u32 t = 0; t < RAW; ++t) {
                if (t < n_tiles) copy(t);
                cp_async_commit();
            }
            for (u32 t = 0; t < n_tiles; ++t) {
                const u32 st = t % STAGES, b = t % RAW;
                cp_async_wait<RAW - 1>();  // this thread's bytes of tile t are in
                if (t >= STAGES) mbar_wait(empty(st), (t / STAGES + 1) & 1);
                for (u32 r = sub; r < BN; r += PASS) {
                    const uint4 k8 = ld_shared16(raw_k(b) + (r * RCH + ch) * 16);
                    st_shared16(ks(st) + fw_off<BN>(r, 2 * ch), e4m3x8_to_bf16(make_uint2(k8.x, k8.y)));
                    st_shared16(ks(st) + fw_off<BN>(r, 2 * ch + 1), e4m3x8_to_bf16(make_uint2(k8.z, k8.w)));
                    const uint4 v8 = ld_shared16(raw_v(b) + (r * RCH + ch) * 16);
                    st_shared16(vs(st) + fw_off<BN>(r, 2 * ch), e4m3x8_to_bf16(make_uint2(v8.x, v8.y)));
                    st_shared16(vs(st) + fw_off<BN>(r, 2 * ch + 1), e4m3x8_to_bf16(make_uint2(v8.z, v8.w)));
                }
                fence_proxy_async();  // the widened tiles, for the consumers' wgmma
                mbar_arrive(full(st));
                if (t + RAW < n_tiles) copy(t + RAW);  // into the buffer this thread just read
                cp_async_commit();
            }
            cp_async_wait<0>();
            return;
        }
        // The producer: CH threads copy a row's chunks, 128 / CH rows an instruction.
        const u32 sub = tid / CH, ch = tid % CH;
        for (u32 t = 0; t < n_tiles; ++t) {
            const u32 st = t % STAGES;
            if (t >= STAGES) mbar_wait(empty(st), (t / STAGES + 1) & 1);
            const u32 key0 = (kt_begin + t) * BN;
#pragma unroll
            for (u32 r = sub; r < BN; r += 128 / CH) {
                const u32 j = key0 + r;
                const bool valid = j <= pos_last;
                const u64 slot = kv_slot(table, valid ? j : pos_last, a.block_size);
                const u64 at = (slot * a.h_kv + kvh) * D + ch * 8;
                cp_async16(ks(st) + fw_off<BN>(r, ch), kc + at, valid);
                cp_async16(vs(st) + fw_off<BN>(r, ch), vc + at, valid);
            }
            mbar_arrive_copies(full(st));
        }
        cp_async_wait<0>();
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(FW_CONSUMER_REGS));
    const u32 wg = warp >> 2;
    if (wg >= consumers) return;

    // Packed row r of the tile: its q/out row.
    auto row_of = [&](u32 r) { return ((u64)cu_q[s] + (p0 + r) / G) * a.h + kvh * G + (p0 + r) % G; };
    // The warpgroup's 64 rows of Q (rows past the sequence are zeros).
    for (u32 c = threadIdx.x & 127; c < 64 * CH; c += 128) {
        const u32 r = wg * 64 + c / CH, ch = c % CH;
        const bool valid = r < rows;
        cp_async16(qs + fw_off<FW_BM>(r, ch), q + row_of(valid ? r : 0) * D + ch * 8, valid);
    }
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();
    asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");

    // This thread's rows: g and g + 8 of the warp's 16.
    const u32 g = lane >> 2, tq = lane & 3;
    u32 pos_r[2], first_r[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const u32 r = min(warp * 16 + g + 8 * i, rows - 1);  // rows past the end mirror the last
        pos_r[i] = base + (p0 + r) / G;
        first_r[i] = (a.window > 0 && pos_r[i] + 1 > a.window) ? pos_r[i] + 1 - a.window : 0;
    }
    float o[D / 2], sc[BN / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
    float m[2] = {-MET_INF, -MET_INF}, l[2] = {0.0f, 0.0f};
    const float log2e = 1.4426950408889634f, scale2 = a.scale * log2e;
    const u32 q_rows = qs + wg * 64 * 128;  // the warpgroup's rows in each column block

    // S = Q Kᵀ of tile t: D / 16 steps of 16 dims, each a 32-byte step inside a 128-byte row.
    auto issue_qk = [&](u32 t) {
        const u32 st = t % STAGES;
#pragma unroll
        for (u32 kk = 0; kk < D / 16; ++kk) {
            const u32 col = (kk >> 2) * (FW_BM * 128) + (kk & 3) * 32;
            const u32 kcol = (kk >> 2) * (BN * 128) + (kk & 3) * 32;
            if constexpr (BN == 128) {
                wgmma_ss_n128(sc, wg_desc(q_rows + col, 16, 1024), wg_desc(ks(st) + kcol, 16, 1024), kk);
            } else {
                wgmma_ss_n64(sc, wg_desc(q_rows + col, 16, 1024), wg_desc(ks(st) + kcol, 16, 1024), kk);
            }
        }
        wg_commit();
    };
    auto await_tile = [&](u32 t) {
        mbar_wait(full(t % STAGES), (t / STAGES) & 1);
        fence_proxy_async();
    };
    await_tile(0);
    wg_fence();
    issue_qk(0);
    wg_wait<0>();
    wg_pin<BN / 2>(sc);

    for (u32 t = 0; t < n_tiles; ++t) {
        const u32 st = t % STAGES;
        // Soft-cap and mask the raw scores, then the online softmax in base 2, the scale
        // folded into the exponent's multiply-add. Accumulator element 4n + e is key
        // 8n + 2tq + (e & 1) of row g + 8 (e >> 1).
        const u32 key0 = (kt_begin + t) * BN;
        // Only tiles that cross a row's causal edge or window start need the mask; the warp
        // decides as one, so the other tiles run without a compare per score.
#ifdef MET_FAULT_DROP_LAST_KV_BLOCK
        const bool edge = true;
#else
        const bool edge = __any_sync(0xffffffffu, key0 + BN - 1 > min(pos_r[0], pos_r[1]) ||
                                                      key0 < max(first_r[0], first_r[1]));
#endif
        float f = scale2;  // raw score to log2 units
        if (a.softcap > 0.0f) {
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) sc[i] = a.softcap * tanhf(sc[i] * a.scale / a.softcap) * log2e;
            f = 1.0f;
        }
        if (edge) {
#pragma unroll
            for (int n = 0; n < BN / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = e >> 1;
                    const u32 j = key0 + n * 8 + 2 * tq + (e & 1);
                    bool seen = j <= pos_r[i] && j >= first_r[i];
#ifdef MET_FAULT_DROP_LAST_KV_BLOCK
                    // The precision gate's deliberate bug (see `paged_attention_bf16`).
                    const u32 last_start = (ctx - 1) / a.block_size * a.block_size;
                    if (last_start > first_r[i] && j >= last_start && j <= pos_r[i]) seen = false;
#endif
                    if (!seen) sc[4 * n + e] = -MET_INF;
                }
            }
        }
        float tile_max[2] = {-MET_INF, -MET_INF};
#pragma unroll
        for (int n = 0; n < BN / 8; ++n) {
            tile_max[0] = fmaxf(tile_max[0], fmaxf(sc[4 * n], sc[4 * n + 1]));
            tile_max[1] = fmaxf(tile_max[1], fmaxf(sc[4 * n + 2], sc[4 * n + 3]));
        }
        float corr[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
            tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
            const float m_new = fmaxf(m[i], tile_max[i] * f);
            // A row that has seen no key yet keeps its zeros: no NaN from -inf - -inf.
            corr[i] = m_new == -MET_INF ? 1.0f : fast_exp2(m[i] - m_new);
            m[i] = m_new;
            l[i] *= corr[i];
        }
        // P in bf16 as the A fragments of P V: keys 16kk .. 16kk + 15 are elements
        // 8kk .. 8kk + 7, pairs of rows g, g + 8, g, g + 8.
        u32 pf[BN / 16][4];
#pragma unroll
        for (int n = 0; n < BN / 8; ++n) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = e >> 1;
                p[e] = m[i] == -MET_INF ? 0.0f : fast_exp2(fmaf(sc[4 * n + e], f, -m[i]));
            }
            // The sum runs over the rounded weights, the ones that multiply V.
            const u32 lo2 = pack_bf16(p[0], p[1]), hi2 = pack_bf16(p[2], p[3]);
            l[0] += __uint_as_float(lo2 << 16) + __uint_as_float(lo2 & 0xffff0000u);
            l[1] += __uint_as_float(hi2 << 16) + __uint_as_float(hi2 & 0xffff0000u);
            pf[n / 2][(n & 1) * 2] = lo2;
            pf[n / 2][(n & 1) * 2 + 1] = hi2;
        }
        if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                o[4 * n] *= corr[0];
                o[4 * n + 1] *= corr[0];
                o[4 * n + 2] *= corr[1];
                o[4 * n + 3] *= corr[1];
            }
        }
        // O += P V (BN / 16 steps of 16 keys, each 2 groups of 8 rows of V), then the next
        // tile's Q Kᵀ: the tensor cores run both while this warpgroup waits, and the other
        // warpgroup's softmax runs beside them.
        const bool more = t + 1 < n_tiles;
        if (more) await_tile(t + 1);
        wg_fence();
#pragma unroll
        for (u32 kk = 0; kk < BN / 16; ++kk) {
            const u64 vd = wg_desc(vs(st) + kk * 2048, BN * 128, 1024);
            if constexpr (D == 256) {
                // Dims 0..127 and 128..255: the second half starts two column blocks on.
                wgmma_rs_n128(o, pf[kk], vd);
                wgmma_rs_n128(o + 64, pf[kk], wg_desc(vs(st) + 2 * BN * 128 + kk * 2048, BN * 128, 1024));
            } else if constexpr (D == 128) {
                wgmma_rs_n128(o, pf[kk], vd);
            } else {
                wgmma_rs_n64(o, pf[kk], vd);
            }
        }
        wg_commit();
        if (more) issue_qk(t + 1);
        // This tile's P V is done once at most the next Q Kᵀ is pending: its stage can be
        // refilled.
        if (more) {
            wg_wait<1>();
        } else {
            wg_wait<0>();
        }
        wg_pin<D / 2>(o);
        __syncwarp();
        if (lane == 0) mbar_arrive(empty(st));
        if (more) {
            wg_wait<0>();
            wg_pin<BN / 2>(sc);
        }
    }
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
        for (int n = 0; n < D / 8; ++n) dst[n * 4 + tq] = pack_bf16(o[4 * n + 2 * i] * inv, o[4 * n + 2 * i + 1] * inv);
    }
}

// NAME, head dim, keys a tile, stages, pool element, e4m3 staging buffers (0 for bf16):
// bf16 tiles of 128 keys in 3 stages (64 keys in 2 at head dim 256); e4m3 pools give a
// stage to their staging buffers where 227 KiB would not hold both.
#define MET_FLASH_PREFILL_WG(NAME, D, BN, STAGES, KV, RAW)                                                     \
    extern "C" __global__ void __launch_bounds__(FW_THREADS, 1)                                                 \
        NAME(bf16_t* out, const bf16_t* q, const KV::T* kc, const KV::T* vc, const u32* cu_q, const u32* seq_lens, \
             const u32* tables, const u32* tiles, AttnArgs a) {                                                 \
        pdl_enter();                                                                                            \
        FW_BODY((flash_prefill_wg<D, BN, STAGES, KV, RAW>(out, q, kc, vc, cu_q, seq_lens, tables, tiles, a)));  \
    }
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
#define FW_BODY(call) call
#else
#define FW_BODY(call)
#endif
MET_FLASH_PREFILL_WG(flash_prefill_wg_bf16_d64, 64, FW_BN, FW_STAGES, Kv16, 0)
MET_FLASH_PREFILL_WG(flash_prefill_wg_bf16_d128, 128, FW_BN, FW_STAGES, Kv16, 0)
MET_FLASH_PREFILL_WG(flash_prefill_wg_bf16_d256, 256, 64, 2, Kv16, 0)
MET_FLASH_PREFILL_WG(flash_prefill_wg_e4m3_d64, 64, FW_BN, FW_STAGES, Kv8, 2)
MET_FLASH_PREFILL_WG(flash_prefill_wg_e4m3_d128, 128, FW_BN, 2, Kv8, 2)
MET_FLASH_PREFILL_WG(flash_prefill_wg_e4m3_d256, 256, 64, 2, Kv8, 1)
