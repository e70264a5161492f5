// gemv.cu: `out [m, n] = x [m, k] · wᵀ (+ bias)` for the smallest decode batches (m <= 4).
//
// At these batch sizes a projection is a stream over its weight matrix: every weight is read
// once from memory and used m times. A block owns R consecutive rows of W, and its threads
// split each row's k between them (thread t takes the 16-byte vectors t, t + 128, ...), so a
// block has all of its rows' loads in flight at once and finishes after a round trip or
// two. Many short blocks (16 KiB of weights, tens per SM) keep every SM streaming until
// the end; few long ones leave the last wave to a handful of SMs. The x rows (a few KiB)
// come through the L1 cache, shared by the blocks of an SM. Weights are loaded with the
// streaming hint, since nothing reads them again this step.
//
// Accumulation is f32. A dot product's order depends only on k (thread partials over fixed
// slices, a fixed shuffle tree per warp, then the warps in order), never on m, n or R, so
// a row's result does not change with the batch it is computed in, and a graph replay at a
// padded batch size gives the eager result bit for bit. Needs k % 8 == 0 and 16-byte
// aligned rows (checked on the host).
//
// The `silu` variant computes the SwiGLU activation straight from a fused gate/up weight
// `[2i, k]`: the block's two rows are gate row j and up row i + j, and it writes
// `silu(round(g)) · round(u)` rounded as `silu_mul_bf16` does, into `out [m, i]`.

#define GEMV_THREADS 128
#define GEMV_WARPS (GEMV_THREADS / 32)
// 16-byte weight loads a thread issues per stage, over the block's rows.
#define GEMV_STAGE 4

// 8 bf16 of `w` dotted with 8 bf16 of `x`, added to `acc` pairwise in a fixed order.
__device__ __forceinline__ float dot8(uint4 w, uint4 x, float acc) {
    const u32 ws[4] = {w.x, w.y, w.z, w.w}, xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        acc = fmaf(__uint_as_float(ws[i] << 16), __uint_as_float(xs[i] << 16), acc);
        acc = fmaf(__uint_as_float(ws[i] & 0xffff0000u), __uint_as_float(xs[i] & 0xffff0000u), acc);
    }
    return acc;
}

// The weights of a GEMV as 16-byte vectors: bf16 here, e4m3 under scales in fp8.cu
// (`GemvE4m3`). A format says how many weights a vector holds (`PER`), where row r's
// vectors start (`bind`, which may note per-row state in slot i), how a loaded vector
// becomes operands (`prepare`, once per vector and row), which x elements they pair with
// (`load_x`, the vector's PER elements of one x row) and how they add into a sum (`dot`).
struct GemvBf16 {
    static constexpr u32 PER = 8;
    typedef uint4 Operands;
    typedef uint4 XVec;
    const bf16_t* w;
    __device__ const uint4* bind(int, u32 row, u32 k) { return reinterpret_cast<const uint4*>(w + (u64)row * k); }
    __device__ Operands prepare(int, uint4 v, u32) const { return v; }
    __device__ static XVec load_x(const uint4* x_row, u32 v) { return __ldg(x_row + v); }
    __device__ static float dot(const Operands& w, const XVec& x, float acc) { return dot8(w, x, acc); }
};

// The block's dots of W rows `rows[0..R)` (in format `F`) with x rows `0..min(m, M)`:
// every thread returns the full sums in `acc`. Called by every thread of the block.
template <int M, int R, typename F>
__device__ __forceinline__ void gemv_dots(const bf16_t* __restrict__ x, F& f, const u32 (&rows)[R], u32 m, u32 k,
                                          float (&acc)[R][M]) {
    constexpr int U = GEMV_STAGE / R;  // vectors per row per stage
    const u32 t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const u32 vecs = k / F::PER, x_vecs = k / 8;
    const uint4* wv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        wv[r] = f.bind(r, rows[r], k);
#pragma unroll
        for (int i = 0; i < M; ++i) acc[r][i] = 0.0f;
    }
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    // Double-buffered: the next stage's weights are requested before this stage's
    // arithmetic, so each thread keeps up to 2 * GEMV_STAGE loads in flight.
    constexpr u32 step = GEMV_THREADS * U;
    uint4 next[U][R];
    auto fetch = [&](u32 base, uint4 (&buf)[U][R]) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const u32 v = base + GEMV_THREADS * u;
#pragma unroll
            for (int r = 0; r < R; ++r) buf[u][r] = v < vecs ? __ldcs(wv[r] + v) : make_uint4(0, 0, 0, 0);
        }
    };
    // The weights are constant for the step, so they are requested before waiting for the
    // kernel that writes x: the first loads overlap that kernel's tail.
    fetch(t, next);
    pdl_wait_prev();
    for (u32 base = t; base < vecs; base += step) {
        uint4 wr[U][R];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) wr[u][r] = next[u][r];
        if (base + step < vecs) fetch(base + step, next);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const u32 v = base + GEMV_THREADS * u;
            if (v >= vecs) break;
            typename F::Operands w[R];
#pragma unroll
            for (int r = 0; r < R; ++r) w[r] = f.prepare(r, wr[u][r], v);
#pragma unroll
            for (int i = 0; i < M; ++i) {
                if (i >= m) break;
                const typename F::XVec xi = F::load_x(xv + (u64)i * x_vecs, v);
#pragma unroll
                for (int r = 0; r < R; ++r) acc[r][i] = F::dot(w[r], xi, acc[r][i]);
            }
        }
    }
    __shared__ float part[GEMV_WARPS][R][M];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < M; ++i) {
            const float s = warp_sum(acc[r][i]);
            if (lane == 0) part[warp][r][i] = s;
        }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < M; ++i) {
            float s = part[0][r][i];
#pragma unroll
            for (int q = 1; q < GEMV_WARPS; ++q) s += part[q][r][i];
            acc[r][i] = s;
        }
}

// grid (ceil(n / R)), block GEMV_THREADS. `bias` may be null.
template <int M, int R>
__device__ void gemv(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, const bf16_t* __restrict__ bias,
                     bf16_t* __restrict__ out, u32 m, u32 n, u32 k) {
    const u32 first = blockIdx.x * R;
    u32 rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = min(first + r, n - 1);
    float acc[R][M];
    GemvBf16 f{w};
    gemv_dots<M, R>(x, f, rows, m, k, acc);
    // Thread r * M + i stores row r of x row i.
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < M; ++i) {
            if (first + r < n && i < m && threadIdx.x == (u32)(r * M + i)) {
                const float b = bias ? bf2f(bias[first + r]) : 0.0f;
                out[(u64)i * n + first + r] = f2bf(acc[r][i] + b);
            }
        }
}

// grid (i), block GEMV_THREADS; w is [2i, k] (gate rows, then up).
template <int M>
__device__ void gemv_silu(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, bf16_t* __restrict__ out,
                          u32 m, u32 half, u32 k) {
    const u32 j = blockIdx.x;
    const u32 rows[2] = {j, half + j};
    float acc[2][M];
    GemvBf16 f{w};
    gemv_dots<M, 2>(x, f, rows, m, k, acc);
#pragma unroll
    for (int i = 0; i < M; ++i) {
        if (i < m && threadIdx.x == (u32)i) {
            const float g = round_bf(acc[0][i]), u = round_bf(acc[1][i]);
            out[(u64)i * half + j] = f2bf(round_bf(g / (1.0f + expf(-g))) * u);
        }
    }
}

#define MET_GEMV(M, R)                                                                                        \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 8)                                             \
        gemv_bf16_m##M##_r##R(const bf16_t* x, const bf16_t* w, const bf16_t* bias, bf16_t* out, u32 m, u32 n, \
                              u32 k) {                                                                        \
        pdl_allow_next();                                                                                     \
        gemv<M, R>(x, w, bias, out, m, n, k);                                                                 \
    }
#define MET_GEMV_SILU(M)                                                                                       \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 8)                                              \
        gemv_silu_bf16_m##M(const bf16_t* x, const bf16_t* w, bf16_t* out, u32 m, u32 half, u32 k) {           \
        pdl_allow_next();                                                                                      \
        gemv_silu<M>(x, w, out, m, half, k);                                                                   \
    }

MET_GEMV(1, 1)
MET_GEMV(1, 2)
MET_GEMV(2, 1)
MET_GEMV(2, 2)
MET_GEMV(4, 1)
MET_GEMV(4, 2)
MET_GEMV_SILU(1)
MET_GEMV_SILU(2)
MET_GEMV_SILU(4)
