// flash_decode.cu: decode attention on tensor cores over the paged cache (the `flash`
// backend's decode kernel), in the flash-decoding manner: a sequence's keys are cut into
// splits, blocks attend to splits side by side, and the last block of a (sequence, KV head)
// to finish merges the splits' partial softmax sums (`dec_merge_if_last`, attention.cu).
//
// Inputs and partials are `decode_attention_bf16`'s (attention.cu): q [seqs, h, d] (one
// query row per sequence), the pools [blocks, block_size, h_kv, d], seq_lens and
// block_tables; part_acc [seqs, h, DEC_SPLITS, d] and part_ml [seqs, h, DEC_SPLITS, 2] in
// f32; a ticket counter per (sequence, KV head), zero between launches. The splits are the
// split kernel's (`dec_splits`, attention.cu), so which block takes a split changes no
// result.
//
// A block of W warps works for the G = h / h_kv query heads of one KV head: they are
// the first G of the 16 rows of one mma operand (the rest are zeros), so each key is read
// once for the group. The block streams its split's keys in tiles of BN = 16 W keys through
// a ring of S shared-memory buffers filled by cp.async, S - 1 tiles ahead of the compute:
// decode is bound by the bytes of K and V, and the ring keeps enough of them in flight.
// Warp w takes keys 16w .. 16w + 15 of every tile (scores Q Kᵀ and O += P V as mma.sync
// m16n8k16, P rounded to bf16 as in the prefill kernel) with its own online softmax, and
// the warps' sums are merged through shared memory at the split's end.
//
// Over e4m3 pools (`Kv8`, attention.cu) the ring holds the pools' bytes (cp.async cannot
// widen), half the bf16 ring's size, and each warp widens its own 16 keys of the tile into
// one bf16 tile (exact: e4m3 is a subset of bf16) just before its products, so only the
// warp waits for it. The keys' scale is in `a.scale`, the values' in `a.v_scale`.

// grid (seqs, h_kv, z <= DEC_SPLITS), block W * 32, dynamic shared memory
// (16 + 2 S BN) D * 2 bytes for bf16 pools, (32 + (2 S + 4) BN) D for e4m3 ones (the query
// tile, the ring of bytes, one bf16 K and V tile). D is 64, 128 or 256; G <= DEC_MAX_GROUP
// (checked on the host).
template <int D, int W, int S, typename KV>
__device__ void flash_decode(float* part_acc, float* part_ml, const bf16_t* q, const typename KV::T* kc,
                             const typename KV::T* vc, const u32* seq_lens, const u32* tables, const AttnArgs& a,
                             bf16_t* out, u32* counters) {
    extern __shared__ __align__(128) unsigned char fd_smem[];
    constexpr u32 CH = D / 8;  // 16-byte chunks per bf16 row
    constexpr u32 BN = W * 16;  // keys per tile: each warp takes 16
    // 16-byte chunks of a pool row as the ring holds it: 8 elements, or 16 e4m3 bytes.
    constexpr u32 RCH = KV::FP8 ? D / 16 : CH;
    const u32 qs = smem_addr(fd_smem);
    // The ring's stage st (K, then V), and the tiles the products read: the stage itself
    // for bf16 pools, the one widened tile for e4m3 ones.
    auto raw_k = [&](u32 st) { return qs + 16 * D * 2 + 2 * st * BN * RCH * 16; };
    auto raw_v = [&](u32 st) { return raw_k(st) + BN * RCH * 16; };
    const u32 wide_k = qs + 16 * D * 2 + 2 * S * BN * RCH * 16, wide_v = wide_k + BN * D * 2;
    auto ks = [&](u32 st) { return KV::FP8 ? wide_k : raw_k(st); };
    auto vs = [&](u32 st) { return KV::FP8 ? wide_v : raw_v(st); };
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 s = blockIdx.x, kvh = blockIdx.y, G = a.h / a.h_kv;
    const DecSplits plan = dec_splits(seq_lens[s], a);
    const u32 first = plan.first, visible = plan.visible, len = plan.len, splits_used = plan.count;
    const u32* table = tables + (u64)s * a.max_blocks;
    const u64 head0 = (u64)s * a.h + kvh * G;

    // The group's query rows, then zeros to 16 rows: a commit group of their own, ahead of
    // the first tiles', so one round trip to memory brings both (the loop's first wait
    // covers it); their fragments are read at the first tile.
    for (u32 c = threadIdx.x; c < 16 * CH; c += blockDim.x) {
        const u32 r = c / CH, ch = c % CH;
        const bool valid = r < G;
        cp_async16(qs + swz<D>(r, ch), q + (head0 + (valid ? r : 0)) * D + ch * 8, valid);
    }
    cp_async_commit();
    u32 qf[D / 16][4];
    bool have_q = false;

    const u32 g = lane >> 2, tq = lane & 3;
    const float log2e = 1.4426950408889634f;
    __shared__ float fd_ml[W][16][2];
    for (u32 split = blockIdx.z; split < splits_used; split += gridDim.z) {
        const u32 begin = first + split * len;
        const u32 end = min(first + visible, begin + len);  // exclusive
        const u32 tiles = end > begin ? (end - begin + BN - 1) / BN : 0;
        auto load_tile = [&](u32 t, u32 st) {
            for (u32 c = threadIdx.x; c < BN * RCH; c += blockDim.x) {
                const u32 r = c / RCH, ch = c % RCH;
                const u32 j = begin + t * BN + r;
                const bool valid = j < end;
                const u32 jj = valid ? j : begin;
                const u64 slot = kv_slot(table, jj, a.block_size);
                const u64 at = (slot * a.h_kv + kvh) * D + ch * (16 / sizeof(typename KV::T));
                // bf16 rows swizzled for ldmatrix; e4m3 rows in order, for the widening.
                const u32 dst = KV::FP8 ? (r * RCH + ch) * 16 : swz<D>(r, ch);
                cp_async16(raw_k(st) + dst, kc + at, valid);
                cp_async16(raw_v(st) + dst, vc + at, valid);
            }
        };
        // e4m3: the warp's 16 keys of stage st widened into the bf16 tiles.
        auto widen_rows = [&](u32 st) {
            __syncwarp();  // the warp's reads of its rows of the last tile are done
            for (u32 i = lane; i < 16 * RCH; i += 32) {
                const u32 r = warp * 16 + i / RCH, ch = i % RCH;
                const uint4 k8 = ld_shared16(raw_k(st) + (r * RCH + ch) * 16);
                const uint4 v8 = ld_shared16(raw_v(st) + (r * RCH + ch) * 16);
                st_shared16(wide_k + swz<D>(r, 2 * ch), e4m3x8_to_bf16(make_uint2(k8.x, k8.y)));
                st_shared16(wide_k + swz<D>(r, 2 * ch + 1), e4m3x8_to_bf16(make_uint2(k8.z, k8.w)));
                st_shared16(wide_v + swz<D>(r, 2 * ch), e4m3x8_to_bf16(make_uint2(v8.x, v8.y)));
                st_shared16(wide_v + swz<D>(r, 2 * ch + 1), e4m3x8_to_bf16(make_uint2(v8.z, v8.w)));
            }
            __syncwarp();
        };
        // One commit group per ring slot, empty ones included, so `wait` counts stay exact.
#pragma unroll
        for (u32 st = 0; st + 1 < S; ++st) {
            if (st < tiles) load_tile(st, st);
            cp_async_commit();
        }

        float o[D / 8][4];
#pragma unroll
        for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        float m[2] = {-MET_INF, -MET_INF}, l[2] = {0.0f, 0.0f};
        for (u32 t = 0; t < tiles; ++t) {
            cp_async_wait<S - 2>();
            // Tile t is in; every warp is done with the slot refilled next (tile t - 1's).
            __syncthreads();
            if (!have_q) {
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk) {
                    const u32 r = lane & 15, ch = kk * 2 + (lane >> 4);
                    ldmatrix_x4(qs + swz<D>(r, ch), qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);
                }
                have_q = true;
            }
            if (t + S - 1 < tiles) load_tile(t + S - 1, (t + S - 1) % S);
            cp_async_commit();
            const u32 st = t % S;
            if constexpr (KV::FP8) widen_rows(st);

            // Scores Q Kᵀ for the warp's 16 keys: two n-tiles of 8.
            float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                const u32 r = warp * 16 + (lane & 7) + ((lane >> 4) << 3), ch = kk * 2 + ((lane >> 3) & 1);
                u32 b0, b1, b2, b3;
                ldmatrix_x4(ks(st) + swz<D>(r, ch), b0, b1, b2, b3);
                mma_bf16(sc[0], qf[kk], b0, b1);
                mma_bf16(sc[1], qf[kk], b2, b3);
            }
            float tile_max[2] = {-MET_INF, -MET_INF};
#pragma unroll
            for (int n = 0; n < 2; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const u32 j = begin + t * BN + warp * 16 + n * 8 + 2 * tq + (e & 1);
                    float x = sc[n][e] * a.scale;
                    if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
                    x = j < end ? x * log2e : -MET_INF;
                    sc[n][e] = x;
                    tile_max[e >> 1] = fmaxf(tile_max[e >> 1], x);
                }
            }
            float corr[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
                tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
                const float m_new = fmaxf(m[i], tile_max[i]);
                corr[i] = m_new == -MET_INF ? 1.0f : fast_exp2(m[i] - m_new);
                m[i] = m_new;
                l[i] *= corr[i];
            }
            // P in the A operand's layout: keys 0-7 of the warp's 16 are k 0-7, keys 8-15 k 8-15.
            u32 pf[4];
#pragma unroll
            for (int n = 0; n < 2; ++n) {
                float p[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) p[e] = m[e >> 1] == -MET_INF ? 0.0f : fast_exp2(sc[n][e] - m[e >> 1]);
                const u32 lo2 = pack_bf16(p[0], p[1]), hi2 = pack_bf16(p[2], p[3]);
                l[0] += bf2f((bf16_t)(lo2 & 0xffff)) + bf2f((bf16_t)(lo2 >> 16));
                l[1] += bf2f((bf16_t)(hi2 & 0xffff)) + bf2f((bf16_t)(hi2 >> 16));
                pf[2 * n] = lo2;
                pf[2 * n + 1] = hi2;
            }
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                o[n][0] *= corr[0];
                o[n][1] *= corr[0];
                o[n][2] *= corr[1];
                o[n][3] *= corr[1];
            }
#pragma unroll
            for (int n = 0; n < D / 8; n += 2) {
                const u32 r = warp * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), ch = n + (lane >> 4);
                u32 b0, b1, b2, b3;
                ldmatrix_x4_trans(vs(st) + swz<D>(r, ch), b0, b1, b2, b3);
                mma_bf16(o[n], pf, b0, b1);
                mma_bf16(o[n + 1], pf, b2, b3);
            }
        }
        cp_async_wait<0>();
        __syncthreads();  // the ring is free: the warps' sums go where the tiles were

        // Each warp's rows (only the first G are real), its max and sum; then the block's
        // threads merge the warps, one (row, dim) each.
        // [W][16][D] past the query rows, which a split without keys leaves unread.
        float* fd_o = reinterpret_cast<float*>(fd_smem + 16 * D * 2);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
            l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
            const u32 r = g + 8 * i;
            if (r >= G) continue;
            if (tq == 0) {
                fd_ml[warp][r][0] = m[i];
                fd_ml[warp][r][1] = l[i];
            }
            float* dst = fd_o + (warp * 16 + r) * D;
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                dst[n * 8 + 2 * tq] = o[n][2 * i];
                dst[n * 8 + 2 * tq + 1] = o[n][2 * i + 1];
            }
        }
        __syncthreads();
        for (u32 idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
            const u32 r = idx / D, e = idx % D;
            float big = -MET_INF;
#pragma unroll
            for (int w = 0; w < W; ++w) big = fmaxf(big, fd_ml[w][r][0]);
            float num = 0.0f, den = 0.0f;
#pragma unroll
            for (int w = 0; w < W; ++w) {
                const float mw = fd_ml[w][r][0];
                const float f = mw == -MET_INF ? 0.0f : fast_exp2(mw - big);
                num += fd_o[(w * 16 + r) * D + e] * f;
                den += fd_ml[w][r][1] * f;
            }
            const u64 head = head0 + r;
            if (splits_used == 1) {  // nothing to merge: the merge would compute exactly this
                out[head * D + e] = f2bf(num / den * a.v_scale);
                continue;
            }
            // The merge works in natural-log units, as the split kernel's partials are.
            part_acc[(head * DEC_SPLITS + split) * D + e] = num;
            if (e == 0) {
                part_ml[(head * DEC_SPLITS + split) * 2] = big / log2e;
                part_ml[(head * DEC_SPLITS + split) * 2 + 1] = den;
            }
        }
        if (splits_used == 1) return;
        if (dec_merge_if_last(out, part_acc, part_ml, counters, s, kvh, G, splits_used, a)) return;
        __syncthreads();  // the next split reuses the ring and the warps' sums
    }
}

#define MET_FLASH_DECODE(NAME, D, W, S, KV)                                                                   \
    extern "C" __global__ void __launch_bounds__(W * 32)                                                       \
        NAME(float* part_acc, float* part_ml, const bf16_t* q, const KV::T* kc, const KV::T* vc,               \
             const u32* seq_lens, const u32* tables, AttnArgs a, bf16_t* out, u32* counters) {                 \
        pdl_enter();                                                                                           \
        flash_decode<D, W, S, KV>(part_acc, part_ml, q, kc, vc, seq_lens, tables, a, out, counters);           \
    }
// Both shapes keep three tiles in the ring: four warps for small batches, whose few blocks
// must each stream fast; two for large ones, whose short contexts are bound by each block's
// round trips, so more blocks an SM (four at d = 128, not two) serve more of them at once.
MET_FLASH_DECODE(flash_decode_bf16_d64_w4, 64, 4, 3, Kv16)
MET_FLASH_DECODE(flash_decode_bf16_d128_w4, 128, 4, 3, Kv16)
MET_FLASH_DECODE(flash_decode_bf16_d64_w2, 64, 2, 3, Kv16)
MET_FLASH_DECODE(flash_decode_bf16_d128_w2, 128, 2, 3, Kv16)
// Head dim 256 (Qwen3.5, Qwen3-Next): four warps take 200 KiB of the ring, two 104 KiB.
MET_FLASH_DECODE(flash_decode_bf16_d256_w4, 256, 4, 3, Kv16)
MET_FLASH_DECODE(flash_decode_bf16_d256_w2, 256, 2, 3, Kv16)
MET_FLASH_DECODE(flash_decode_e4m3_d64_w4, 64, 4, 3, Kv8)
MET_FLASH_DECODE(flash_decode_e4m3_d128_w4, 128, 4, 3, Kv8)
MET_FLASH_DECODE(flash_decode_e4m3_d64_w2, 64, 2, 3, Kv8)
MET_FLASH_DECODE(flash_decode_e4m3_d128_w2, 128, 2, 3, Kv8)
MET_FLASH_DECODE(flash_decode_e4m3_d256_w4, 256, 4, 3, Kv8)
MET_FLASH_DECODE(flash_decode_e4m3_d256_w2, 256, 2, 3, Kv8)
