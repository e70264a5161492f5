// sample.cu: batched token sampling on the device; only the drawn tokens, their logprobs
// and the top logprobs leave it.
//
// One block per sample row, with the CPU reference's semantics (`src/cpu/sample.rs`):
// penalties and bans on a sanitized copy of the row (the host lists each touched token once
// with its bias values in order, its repetition flag, output count and ban), greedy argmax
// with ties to the lower id, or tempered weights w = exp((x - max) / T) filtered by min_p,
// top_k (a count radix select) and top_p (a cumulative radix select), then the inverse CDF
// walked best first at u = uniform(seed, step), the same SplitMix64 stream as `src/rng.rs`.
//
// Ranking uses the CPU's 64-bit key: the value's bits mapped so that larger values give
// smaller integers, then the id, so ties go to the lower id and every key is unique. A radix
// select finds, byte by byte from the top, the key where a running count or weight sum
// taken in key order first reaches a target, with no sort. Weight sums are fixed point
// (2^-40 units, integer atomics), so they are exact and independent of thread order: draws
// are deterministic, and differ from the CPU's f64 sums only for a target within ~1e-7 of a
// CDF boundary.

#define SAMPLE_THREADS 1024
#define ROW_WORDS 20
#define PEN_WORDS 5
#define MAX_TOP 20
#define NO_TOKEN 0xffffffffu
#define FLAG_GREEDY 1u
#define FLAG_SCRATCH 2u
#define FIX_SCALE 1099511627776.0  // 2^40

// `rng::uniform`: the top 24 bits of mix64(seed ^ mix64((step + 1) * GAMMA)).
__device__ __forceinline__ float uniform01(u64 seed, u64 step) {
    const u64 bits = mix64(seed ^ mix64((step + 1ull) * 0x9E3779B97F4A7C15ull));
    return (float)(bits >> 40) * (1.0f / 16777216.0f);
}

// NaN never wins, +inf stays finite, -0 becomes 0 (the CPU's `sanitize`).
__device__ __forceinline__ float sanitize(float x) { return x != x ? -MET_INF : fminf(x, MET_FLT_MAX) + 0.0f; }

__device__ __forceinline__ u64 cand_key(float v, u32 id) {
    const u32 bits = __float_as_uint(v);
    const u32 asc = (bits >> 31) ? ~bits : (bits | 0x80000000u);
    return ((u64)(~asc) << 32) | id;
}

__device__ __forceinline__ u64 fixed_weight(float w) { return (u64)rint((double)w * FIX_SCALE); }

struct SelectShared {
    u64 sum[256];
    u32 cnt[256];
    u64 prefix;
    u64 before;
    u64 scratch_u64[32];
    float scratch_f[32];
    double scratch_d[32];
    u32 top_count;
    u64 top_keys[MAX_TOP];
};

// Radix select over the valid elements of `n` in key order. `key_of(i, &key, &weight)`
// returns whether element i takes part. COUNT mode: finds the element where the running
// count reaches `k`. SUM mode: finds where the running fixed-point weight sum first
// satisfies `cum >= target` (or `>` when `strict`); when rounding leaves the target
// unreached, the last element. Returns its key; `*before` gets the sum (or count) of the
// elements ranked above it. Every thread of the block must call it.
template <bool SUM, typename KeyFn>
__device__ u64 radix_select(u32 n, KeyFn key_of, u64 k, double target, bool strict, SelectShared* sh, u64* before) {
    __syncthreads();  // earlier readers of sh->prefix and sh->before are done
    if (threadIdx.x == 0) {
        sh->prefix = 0;
        sh->before = 0;
    }
    for (int pass = 0; pass < 8; ++pass) {
        const int shift = 56 - 8 * pass;
        for (u32 b = threadIdx.x; b < 256; b += blockDim.x) {
            sh->sum[b] = 0;
            sh->cnt[b] = 0;
        }
        __syncthreads();
        const u64 prefix = sh->prefix;
        for (u32 base = 0; base < n; base += blockDim.x) {
            const u32 i = base + threadIdx.x;
            u64 key = 0, w = 0;
            u32 bucket = 256;
            if (i < n && key_of(i, &key, &w) && (pass == 0 || (key >> (shift + 8)) == prefix))
                bucket = (u32)(key >> shift) & 255u;
            // Lanes that share a bucket add their count once (shared atomics on one address
            // serialise, and the top bytes of nearby values coincide).
            const u32 peers = __match_any_sync(0xffffffffu, bucket);
            if (bucket < 256) {
                if ((threadIdx.x & 31) == (u32)(__ffs(peers) - 1)) atomicAdd(&sh->cnt[bucket], (u32)__popc(peers));
                if (SUM) atomicAdd(&sh->sum[bucket], w);
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            u64 cum = sh->before;
            int chosen = -1, last = -1;
            for (int b = 0; b < 256; ++b) {
                if (sh->cnt[b] == 0) continue;
                last = b;
                const u64 through = cum + (SUM ? sh->sum[b] : (u64)sh->cnt[b]);
                const bool reached = SUM ? (strict ? (double)through > target : (double)through >= target) : through >= k;
                if (reached) {
                    chosen = b;
                    break;
                }
                cum = through;
            }
            if (chosen < 0 && last >= 0) {
                chosen = last;
                cum -= SUM ? sh->sum[last] : (u64)sh->cnt[last];
            }
            sh->before = cum;
            sh->prefix = (prefix << 8) | (u64)(chosen < 0 ? 0 : chosen);
        }
        __syncthreads();
    }
    *before = sh->before;
    return sh->prefix;
}

struct RowParams {
    u32 logits_row, flags, top_k, seed_lo, seed_hi, step_lo, step_hi, n_top, pen_start, pen_count, scratch_row;
    float temperature, top_p, min_p, repetition, frequency, presence;
};

__device__ RowParams read_row(const u32* w) {
    RowParams p;
    p.logits_row = w[0];
    p.flags = w[1];
    p.temperature = __uint_as_float(w[2]);
    p.top_k = w[3];
    p.top_p = __uint_as_float(w[4]);
    p.min_p = __uint_as_float(w[5]);
    p.seed_lo = w[6];
    p.seed_hi = w[7];
    p.step_lo = w[8];
    p.step_hi = w[9];
    p.n_top = w[10];
    p.pen_start = w[11];
    p.pen_count = w[12];
    p.scratch_row = w[13];
    p.repetition = __uint_as_float(w[14]);
    p.frequency = __uint_as_float(w[15]);
    p.presence = __uint_as_float(w[16]);
    return p;
}

// Steps 2-5 of the CPU's rules into `s`: a sanitized copy of the raw row, then each listed
// token recomputed from its raw logit (bias values in order, repetition, frequency and
// presence, sanitize, ban).
template <typename T>
__device__ void apply_penalties(const T* raw, float* s, u32 vocab, const RowParams& p, const u32* pens,
                                const float* biases) {
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) s[i] = sanitize(load_f(raw, i));
    __syncthreads();
    for (u32 e = threadIdx.x; e < p.pen_count; e += blockDim.x) {
        const u32* pe = pens + (u64)(p.pen_start + e) * PEN_WORDS;
        const u32 t = pe[0], flags = pe[1], count = pe[2], bias_start = pe[3], bias_count = pe[4];
        float v = load_f(raw, t);
        for (u32 b = 0; b < bias_count; ++b) v += biases[bias_start + b];
        if (flags & 1u) v = v > 0.0f ? v / p.repetition : v * p.repetition;
        if (count > 0) v -= p.frequency * (float)count + p.presence;
        v = sanitize(v);
        if (flags & 2u) v = -MET_INF;
        s[t] = v;
    }
    __syncthreads();
}

// The first largest value (ties to the lower id), or NO_TOKEN when every value is -inf.
template <typename T>
__device__ u32 argmax_row(const T* x, u32 vocab, bool raw, SelectShared* sh) {
    float best = -MET_INF;
    u32 best_i = NO_TOKEN;
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = raw ? sanitize(load_f(x, i)) : load_f(x, i);
        if (v > best) {
            best = v;
            best_i = i;
        }
    }
    const float m = block_max(best, sh->scratch_f);
    // The lowest id holding the max: min over threads whose best equals it.
    u32 cand = (best == m && m > -MET_INF) ? best_i : NO_TOKEN;
    for (int o = 16; o > 0; o >>= 1) cand = min(cand, __shfl_xor_sync(0xffffffffu, cand, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh->cnt[threadIdx.x >> 5] = cand;
    __syncthreads();
    u32 r = NO_TOKEN;
    for (u32 w = 0; w < (blockDim.x >> 5); ++w) r = min(r, sh->cnt[w]);
    __syncthreads();
    return r;
}

// Step 7: tempered weights, min_p, top_k, top_p, then the inverse-CDF draw. `s` holds the
// penalised, sanitized row and is overwritten with the candidates' weights (0: dropped).
__device__ u32 draw_row(float* s, u32 vocab, const RowParams& p, SelectShared* sh) {
    float m = -MET_INF;
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) m = fmaxf(m, s[i]);
    m = block_max(m, sh->scratch_f);
    if (m == -MET_INF) return NO_TOKEN;
    u64 count = 0;
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float w = expf((s[i] - m) / p.temperature);
        const bool keep = w > 0.0f && w >= p.min_p;
        s[i] = keep ? w : 0.0f;
        count += keep;
    }
    count = block_sum_u64(count, sh->scratch_u64);
    if (count == 0) return NO_TOKEN;
    u64 bound = ~0ull, before = 0;
    auto in_bound = [&](u32 i, u64* key, u64* w) {
        const float v = s[i];
        if (!(v > 0.0f)) return false;
        *key = cand_key(v, i);
        *w = fixed_weight(v);
        return *key <= bound;
    };
    if (p.top_k > 0 && p.top_k < count) bound = radix_select<false>(vocab, in_bound, p.top_k, 0.0, false, sh, &before);
    u64 mass = 0;
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) {
        u64 key, w;
        if (in_bound(i, &key, &w)) mass += w;
    }
    mass = block_sum_u64(mass, sh->scratch_u64);
    if (p.top_p < 1.0f) {
        const u64 key = radix_select<true>(vocab, in_bound, 0, (double)p.top_p * (double)mass, false, sh, &before);
        mass = before + fixed_weight(s[(u32)key]);
        bound = key;
    }
    const double u = (double)uniform01(((u64)p.seed_hi << 32) | p.seed_lo, ((u64)p.step_hi << 32) | p.step_lo);
    const u64 key = radix_select<true>(vocab, in_bound, 0, u * (double)mass, true, sh, &before);
    return (u32)key;
}

// log-sum-exp of the sanitized raw row: max, then an f64 sum of f32 exps (as the CPU).
template <typename T>
__device__ float log_sum_exp(const T* raw, u32 vocab, SelectShared* sh) {
    float m = -MET_INF;
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) m = fmaxf(m, sanitize(load_f(raw, i)));
    m = block_max(m, sh->scratch_f);
    double sum = 0.0;
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) sum += (double)expf(sanitize(load_f(raw, i)) - m);
    sum = block_sum_d(sum, sh->scratch_d);
    return m + (float)log(sum);
}

// The `k` best raw logits as keys, best first, into sh->top_keys.
template <typename T>
__device__ void top_keys(const T* raw, u32 vocab, u32 k, SelectShared* sh) {
    auto any = [&](u32 i, u64* key, u64* w) {
        *key = cand_key(sanitize(load_f(raw, i)), i);
        *w = 0;
        return true;
    };
    u64 before;
    const u64 kth = radix_select<false>(vocab, any, k, 0.0, false, sh, &before);
    if (threadIdx.x == 0) sh->top_count = 0;
    __syncthreads();
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) {
        const u64 key = cand_key(sanitize(load_f(raw, i)), i);
        if (key <= kth) {
            const u32 at = atomicAdd(&sh->top_count, 1u);
            if (at < MAX_TOP) sh->top_keys[at] = key;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const u32 n = min(sh->top_count, (u32)MAX_TOP);
        for (u32 a = 1; a < n; ++a) {
            const u64 key = sh->top_keys[a];
            u32 b = a;
            for (; b > 0 && sh->top_keys[b - 1] > key; --b) sh->top_keys[b] = sh->top_keys[b - 1];
            sh->top_keys[b] = key;
        }
    }
    __syncthreads();
}

// rows [n, ROW_WORDS] (see `RowParams`), pens [*, PEN_WORDS], scratch [*, vocab].
// Outputs per row: tokens (NO_TOKEN when every token is banned or masked), the logprob of
// the token and the top logprobs [n, MAX_TOP] (ids and values), when asked.
// The logits are f32 or bf16 (`T`), read as f32.
template <typename T>
__device__ void sample_rows(const T* logits, u32 vocab, const u32* rows, const u32* pens, const float* biases,
                            float* scratch, u32* tokens, float* logprobs, u32* top_ids, float* top_vals) {
    __shared__ SelectShared sh;
    const RowParams p = read_row(rows + (u64)blockIdx.x * ROW_WORDS);
    const T* raw = logits + (u64)p.logits_row * vocab;
    float* s = scratch + (u64)p.scratch_row * vocab;
    u32 token;
    if (p.flags & FLAG_SCRATCH) {
        apply_penalties(raw, s, vocab, p, pens, biases);
        token = (p.flags & FLAG_GREEDY) ? argmax_row(s, vocab, false, &sh) : draw_row(s, vocab, p, &sh);
    } else {
        token = argmax_row(raw, vocab, true, &sh);
    }
    if (threadIdx.x == 0) tokens[blockIdx.x] = token;
    if (p.n_top == 0xffffffffu || token == NO_TOKEN) return;  // no logprobs asked
    const float lse = log_sum_exp(raw, vocab, &sh);
    if (threadIdx.x == 0) logprobs[blockIdx.x] = sanitize(load_f(raw, token)) - lse;
    if (p.n_top == 0) return;
    top_keys(raw, vocab, p.n_top, &sh);
    for (u32 j = threadIdx.x; j < p.n_top; j += blockDim.x) {
        const u32 id = (u32)sh.top_keys[j];
        top_ids[(u64)blockIdx.x * MAX_TOP + j] = id;
        top_vals[(u64)blockIdx.x * MAX_TOP + j] = sanitize(load_f(raw, id)) - lse;
    }
}

#define MET_SAMPLE_ROWS(NAME, T)                                                                                 \
    extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)                                                 \
        NAME(const T* logits, u32 vocab, const u32* rows, const u32* pens, const float* biases, float* scratch,   \
             u32* tokens, float* logprobs, u32* top_ids, float* top_vals) {                                      \
        pdl_enter();                                                                                             \
        sample_rows(logits, vocab, rows, pens, biases, scratch, tokens, logprobs, top_ids, top_vals);            \
    }
MET_SAMPLE_ROWS(sample_rows_f32, float)
MET_SAMPLE_ROWS(sample_rows_bf16, bf16_t)

// ---- greedy rows without penalties or logprobs ----------------------------------------------
//
// The argmax alone, spread over ARGMAX_PARTS blocks per row (one block per row reads a
// 128k-entry row at a fraction of the bandwidth): each part finds its first largest
// sanitized value, `argmax_merge` picks the first largest over the parts. The result is
// `argmax_row(raw, vocab, true, ..)`'s: ties go to the lower id, NO_TOKEN when all are -inf.

#define ARGMAX_PARTS 32
#define ARGMAX_THREADS 256

// The first largest sanitized value of x[lo, hi) among this thread's elements, visited in
// increasing order. bf16 rows are read 8 values (16 bytes) at a time from the first aligned
// element: the scalar head and tail hold the rest.
template <typename T>
__device__ void argmax_span(const T* x, u32 lo, u32 hi, float& best, u32& best_i) {
    auto take = [&](float v, u32 i) {
        v = sanitize(v);
        if (v > best) {
            best = v;
            best_i = i;
        }
    };
    u32 body = lo;
    if constexpr (sizeof(T) == 2) {
        while (body < hi && (reinterpret_cast<u64>(x + body) & 15)) ++body;
        for (u32 i = lo + threadIdx.x; i < body; i += blockDim.x) take(load_f(x, i), i);
        const u32 chunks = (hi - body) / 8;
        const uint4* xv = reinterpret_cast<const uint4*>(x + body);
        for (u32 c = threadIdx.x; c < chunks; c += blockDim.x) {
            float v[8];
            unpack8(xv[c], v);
#pragma unroll
            for (int e = 0; e < 8; ++e) take(v[e], body + 8 * c + e);
        }
        body += 8 * chunks;
    }
    for (u32 i = body + threadIdx.x; i < hi; i += blockDim.x) take(load_f(x, i), i);
}

// grid (rows, ARGMAX_PARTS), block ARGMAX_THREADS. `rows[r]` is the logits row of row r.
template <typename T>
__device__ void argmax_parts(const T* logits, u32 vocab, const u32* rows, float* part_v, u32* part_i) {
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ u32 si[ARGMAX_THREADS / 32];
    const u32 r = blockIdx.x, p = blockIdx.y;
    const T* x = logits + (u64)rows[r] * vocab;
    const u32 per = (vocab + ARGMAX_PARTS - 1) / ARGMAX_PARTS;
    const u32 lo = min(vocab, p * per), hi = min(vocab, lo + per);
    float best = -MET_INF;
    u32 best_i = NO_TOKEN;
    argmax_span(x, lo, hi, best, best_i);
    // (value, id) pairs: the larger value wins, then the lower id.
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, best, o);
        const u32 i = __shfl_xor_sync(0xffffffffu, best_i, o);
        if (v > best || (v == best && i < best_i)) {
            best = v;
            best_i = i;
        }
    }
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = best;
        si[warp] = best_i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (u32 w = 1; w < blockDim.x / 32; ++w) {
            if (sv[w] > best || (sv[w] == best && si[w] < best_i)) {
                best = sv[w];
                best_i = si[w];
            }
        }
        part_v[r * ARGMAX_PARTS + p] = best;
        part_i[r * ARGMAX_PARTS + p] = best == -MET_INF ? NO_TOKEN : best_i;
    }
}


#define MET_ARGMAX_PARTS(NAME, T)                                                                                \
    extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)                                                 \
        NAME(const T* logits, u32 vocab, const u32* rows, float* part_v, u32* part_i) {                          \
        pdl_enter();                                                                                             \
        argmax_parts(logits, vocab, rows, part_v, part_i);                                                       \
    }
MET_ARGMAX_PARTS(argmax_parts_f32, float)
MET_ARGMAX_PARTS(argmax_parts_bf16, bf16_t)

// grid (rows), block 32 (one lane per part).
extern "C" __global__ void argmax_merge(const float* part_v, const u32* part_i, u32* tokens) {
    pdl_enter();
    const u32 r = blockIdx.x, lane = threadIdx.x;
    float best = part_v[r * ARGMAX_PARTS + lane];
    u32 best_i = part_i[r * ARGMAX_PARTS + lane];
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, best, o);
        const u32 i = __shfl_xor_sync(0xffffffffu, best_i, o);
        if (v > best || (v == best && i < best_i)) {
            best = v;
            best_i = i;
        }
    }
    if (lane == 0) tokens[r] = best == -MET_INF ? NO_TOKEN : best_i;
}

// Structured output: out[i, t] = logits[rows[i], t] where bit t % 32 of word t / 32 of mask
// row i is set, else -inf (`GpuBackend::mask_logits`). Row ids are checked on the host.
template <typename T>
__device__ void mask_logits(const T* logits, const u32* rows, const u32* masks, float* out, u32 v, u32 words,
                            u64 total) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u64 r = i / v;
        const u32 t = (u32)(i % v);
        const bool allowed = (masks[r * words + (t >> 5)] >> (t & 31u)) & 1u;
        out[i] = allowed ? load_f(logits, (u64)rows[r] * v + t) : -MET_INF;
    }
}

#define MET_MASK_LOGITS(NAME, T)                                                                                 \
    extern "C" __global__ void NAME(const T* logits, const u32* rows, const u32* masks, float* out, u32 v,        \
                                    u32 words, u64 total) {                                                      \
        pdl_enter();                                                                                             \
        mask_logits(logits, rows, masks, out, v, words, total);                                                  \
    }
MET_MASK_LOGITS(mask_logits_f32, float)
MET_MASK_LOGITS(mask_logits_bf16, bf16_t)
