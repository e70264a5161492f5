//! AVX-512 VNNI and AVX2 integer kernels for packed rows against `q8` activation rows
//! ([`super::q8`]); the grouped K-quant matrices have kernels of their own
//! ([`super::x86_grouped`]).
//!
//! Register blocking: a kernel call takes `R` weight rows and `M` activation rows and keeps
//! `R · M` accumulators live, so every weight block is loaded and unpacked once for all `M`
//! activation rows and every activation block once for all `R` weight rows. Per block and
//! pair of rows the exact integer sum is formed in i32 lanes, converted and scaled by
//! `dw · dx` into f32 accumulators; the Q4 minimum terms `m · dx · Σ qx` join the same
//! accumulators 16 (or 8) blocks at a time, and the lanes are summed once at the end.
//!
//! Why the sums are exact (no saturation anywhere):
//! - Q4 blocks put the unsigned nibble (0..=15) in the u8 operand and `qx` (−127..=127) in
//!   the i8 one; `vpmaddubsw` pairs stay within ±3810 and `vpdpbusd` adds into i32.
//! - Q8_0 weights are signed, so the u8 operand is `|w|` (≤ 128) and the i8 one is `qx`
//!   with `w`'s sign (llama.cpp's sign trick); pairs stay within ±32 512 < 2¹⁵.
//!
//! Each (weight row, activation row) accumulator sees the same operations in the same
//! order whatever `R` and `M` are, which is what makes results independent of how many
//! rows run together.

use std::arch::x86_64::*;

use super::q8::{ActRow, Q8Rows, WeightRow};
use super::x86::WIDEN;
use super::x86_isa::{Avx2, Avx512, IntIsa, Q4Blocks, Q8Blocks, Weights};
use super::{PackedQuant, QuantFormat, SimdLevel};

/// Most activation rows one kernel call carries (AVX-512 has registers for 2 × 8
/// accumulators plus operands).
const MAX_M: usize = 8;

/// From this many activation rows (a prompt), groups of [`PROMPT_M`] rows against tiles of
/// four weight rows rather than eight against one.
const MANY_M: usize = 16;

/// Activation rows per kernel call for prompts.
const PROMPT_M: usize = 4;

/// A kernel over the `R` weight rows of a matrix from a given one and `M` activation rows.
type Kernel<const R: usize, const M: usize> = unsafe fn(&PackedQuant, usize, &[ActRow<'_>; M]) -> [[f32; M]; R];

/// The output of one `dot_rows` call and what every tile of it shares.
struct Job<'a, 'p> {
    level: SimdLevel,
    /// Fewer than [`MANY_M`] activation rows (a decode step): each weight is read once,
    /// from memory, rather than again by each group of a prompt's rows.
    streaming: bool,
    p: &'p PackedQuant,
    rows: std::ops::Range<usize>,
    out: &'a mut [f32],
}

/// `out[i · rows.len() + j] = x_i · row (rows.start + j)` with the kernels of `level`;
/// false for a level without integer kernels here (`None`).
pub(super) fn dot_rows(
    level: SimdLevel,
    p: &PackedQuant,
    x: &Q8Rows,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) -> bool {
    if level == SimdLevel::None {
        return false;
    }
    let m = x.rows();
    let mut job = Job { level, streaming: m < MANY_M, p, rows, out };
    let group = if m >= MANY_M { PROMPT_M } else { MAX_M };
    for first in (0..m).step_by(group) {
        match (m - first).min(group) {
            1 => job.group::<1>(x, first),
            2 => job.group::<2>(x, first),
            3 => job.group::<3>(x, first),
            4 => job.group::<4>(x, first),
            5 => job.group::<5>(x, first),
            6 => job.group::<6>(x, first),
            7 => job.group::<7>(x, first),
            _ => job.group::<8>(x, first),
        }
    }
    true
}

impl Job<'_, '_> {
    /// Activation rows `first..first + M` against every weight row, in tiles of as many
    /// weight rows as the registers hold accumulators for.
    fn group<const M: usize>(&mut self, x: &Q8Rows, first: usize) {
        let acts: [ActRow<'_>; M] = std::array::from_fn(|i| x.row(first + i));
        // Measured on Zen 4 (bench `matmul_quant`, q4_1 k576 n1536): AVX-512 with 8 rows
        // ran 125 µs with 1 weight row per tile and 186 µs with 2 (accumulators spilled),
        // 5 rows 70 µs with 4 and 77 µs with 2; AVX2 (16 registers) was fastest with 2
        // weight rows for 1 row and 1 weight row from 4 rows up. A decode step streams its
        // weights from memory, and there AVX-512 is fastest one weight row at a time, the
        // rows read in address order as one stream rather than several (bench
        // `decode_kquant` when the K-quants still ran here, 28 Qwen3-0.6B layers of
        // Q4_K/Q6_K, alternating rounds, medians:
        // one activation row 14.9 ms with 1 weight row, 17.7 with 2 and with 4; two rows
        // 19.9 with 1 or 2, 21.4 with 4; four rows 32.1, 36.6 and 39.2; a whole Q4_K_M
        // decode 41.0 against 32.7 tok/s, the Q4_1 default model 141 against 122). With
        // AVX2 one weight row was no faster than 2 for one activation row (27.8 against
        // 29.6 tok/s).
        let tile = match (self.level, M) {
            (SimdLevel::Avx512, _) if self.streaming => 1,
            // A prompt's groups, at most PROMPT_M rows.
            (SimdLevel::Avx512, _) => 4,
            (_, ..=2) => 2,
            _ => 1,
        };
        // Chosen once per group, not per tile: a decode tile is a few dozen blocks.
        let (four, two, one) = (self.kernel::<4, M>(), self.kernel::<2, M>(), self.kernel::<1, M>());
        let mut r = self.rows.start;
        while r < self.rows.end {
            let left = self.rows.end - r;
            r += if tile >= 4 && left >= 4 {
                self.tile(four, r, first, &acts)
            } else if tile >= 2 && left >= 2 {
                self.tile(two, r, first, &acts)
            } else {
                self.tile(one, r, first, &acts)
            };
        }
    }

    /// The kernel for `R` weight rows of the matrix's format and `M` activation rows.
    fn kernel<const R: usize, const M: usize>(&self) -> Kernel<R, M> {
        if self.level == SimdLevel::Avx512 {
            match self.p.format() {
                QuantFormat::Q8_0 => kernel_512::<Q8Blocks, R, M>,
                _ => kernel_512::<Q4Blocks, R, M>,
            }
        } else {
            match self.p.format() {
                QuantFormat::Q8_0 => kernel_256::<Q8Blocks, R, M>,
                _ => kernel_256::<Q4Blocks, R, M>,
            }
        }
    }

    /// Weight rows `r..r + R` against the group with `kernel`; returns `R`.
    fn tile<const R: usize, const M: usize>(
        &mut self,
        kernel: Kernel<R, M>,
        r: usize,
        first: usize,
        acts: &[ActRow<'_>; M],
    ) -> usize {
        // SAFETY: `dot_rows` runs only at a level the CPU has (the caller caps it at the
        // detected one, and AVX-512 here implies VNNI); rows `r..r + R` exist, every row
        // holds `nb` scales and payloads and every activation row `32 · nb` quants
        // (checked by the caller).
        let got = unsafe { kernel(self.p, r, acts) };
        let n = self.rows.len();
        for (j, got) in got.iter().enumerate() {
            for (i, g) in got.iter().enumerate() {
                self.out[(first + i) * n + (r - self.rows.start) + j] = *g;
            }
        }
        R
    }
}

/// Quantises every block of `x` into `rows` with AVX2 (bit for bit what
/// `q8::quantize_block` gives); false without AVX2.
pub(super) fn quantize(level: SimdLevel, x: &[f32], rows: &mut Q8Rows) -> bool {
    if level.min(SimdLevel::detected()) == SimdLevel::None {
        return false;
    }
    for (b, (xb, qb)) in x.chunks_exact(32).zip(rows.qs.chunks_exact_mut(32)).enumerate() {
        // SAFETY: the CPU has AVX2 (checked above); both blocks hold 32 values.
        (rows.d[b], rows.s[b]) = unsafe { quantize_block_256(xb, qb) };
    }
    true
}

/// One block of 32 values: `d = max|x| / 127`, `q = round(x / d)` (ties to even, as the
/// scalar quantiser), returning `d` and `d · Σ q`.
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_block_256(x: &[f32], q: &mut [i8]) -> (f32, f32) {
    debug_assert!(x.len() == 32 && q.len() == 32);
    // SAFETY: both slices hold 32 elements (one block).
    unsafe {
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
        let m = v.iter().fold(_mm256_setzero_ps(), |m, v| _mm256_max_ps(m, _mm256_and_ps(*v, abs)));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
        let d = amax / 127.0;
        let inv = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let i: [__m256i; 4] = std::array::from_fn(|j| {
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(v[j], inv));
            _mm256_cvtps_epi32(r)
        });
        let sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        let sum = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256::<1>(sum));
        let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b01_00_11_10>(sum));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(sum, _mm_shuffle_epi32::<0b10_11_00_01>(sum)));
        // The packs work within 128-bit lanes; the permute puts the 4-byte groups back in order.
        let packed = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        let ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(q.as_mut_ptr().cast(), ordered);
        (d, d * sum as f32)
    }
}

/// How many tiles ahead (of `R` weight rows, which lie back to back) the kernels prefetch
/// the weights for a decode step ([`prefetches`]), whatever the format: a tile of short
/// rows is over before the hardware prefetchers have found its streams, so a decode step
/// would wait on memory at every tile. Measured (bench `decode_kquant` when the K-quants
/// still ran here, 200 MB of Q4_K and Q6_K weights, alternating runs on a loaded machine):
/// 48 → 33 ms; two tiles ahead did no better than one. The default model's Q4_1 decode gains too
/// (`bench/results/cpu-kquant-2026-12-03/q4_1-default-model.md`).
const PREFETCH_TILES: usize = 1;

/// The fewest weight rows ahead the prefetch reads, for tiles of one row (AVX-512's decode
/// steps, AVX2's of three rows): one row of 1024 K-quant weights was over too soon.
/// Measured (`decode_kquant`, then on these kernels, one activation row, 4 alternating
/// rounds, medians): 10.2 ms one row ahead, 9.6 two and four, 10.8 without prefetches; two
/// activation rows 13.4, 13.3, 13.3 and 14.2 ms.
const PREFETCH_MIN_ROWS: usize = 2;

/// Raw views of a group's rows, read without bounds checks in the inner loops (the
/// callers of `dot_rows` checked every length once). `wd` are the weight rows' scales of
/// the current group of `WIDEN` blocks, widened to f32, indexed from the group's start.
struct Ptrs<const R: usize, const M: usize> {
    wq: [*const u8; R],
    /// How far ahead of a row's block the prefetch reads.
    ahead: usize,
    wd: [*const f32; R],
    aq: [*const i8; M],
    ad: [*const f32; M],
}

impl<const R: usize, const M: usize> Ptrs<R, M> {
    fn of(w: &[WeightRow<'_>; R], a: &[ActRow<'_>; M], dw: &[[f32; WIDEN]; R]) -> Self {
        Self {
            wq: std::array::from_fn(|r| w[r].qs.as_ptr()),
            ahead: (PREFETCH_TILES * R).max(PREFETCH_MIN_ROWS) * w[0].qs.len(),
            wd: std::array::from_fn(|r| dw[r].as_ptr()),
            aq: std::array::from_fn(|i| a[i].qs.as_ptr()),
            ad: std::array::from_fn(|i| a[i].d.as_ptr()),
        }
    }
}

/// The scales of a group's blocks `c .. c + n` for every pair of weight row `r` and
/// activation row `i`: `out[r][i][j] = dw[r][j] · dx_i[c + j]`, eight products per
/// instruction rather than one per block and pair in the inner loop, which then broadcasts
/// each from memory (a load, off the vector ALU ports that the integer dots keep busy). The
/// products are the ones the inner loop would form, so the sums do not change. Worth it from
/// [`PRODUCTS_FROM`] activation rows on (measured on AVX2, q4_1 k576 n1536: 8 rows 100 →
/// 94.5 µs, 5 rows 65.9 → 63.7; one row 20.0 → 27.4, hence not for few rows).
///
/// Left uninitialised past `n`: a kernel call covers a few weight rows, so zeroing the
/// array would cost as much as the products.
///
/// # Safety
/// Every activation row must hold `c + n` scales; the CPU must have AVX2.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_scales_256<const R: usize, const M: usize>(
    dw: &[[f32; WIDEN]; R],
    a: &[ActRow<'_>; M],
    c: usize,
    n: usize,
    out: &mut BlockScales<R, M>,
) {
    for i in 0..M {
        let dx = &a[i].d[c..c + n];
        let mut j = 0;
        while j + 8 <= n {
            // SAFETY: `j + 8 <= n <= WIDEN`, within `dx` and every row of `dw` and `out`.
            unsafe {
                let x = _mm256_loadu_ps(dx.as_ptr().add(j));
                for r in 0..R {
                    let product = _mm256_mul_ps(_mm256_loadu_ps(dw[r].as_ptr().add(j)), x);
                    _mm256_storeu_ps(out[r][i].as_mut_ptr().add(j).cast(), product);
                }
            }
            j += 8;
        }
        for j in j..n {
            for r in 0..R {
                out[r][i][j].write(dw[r][j] * dx[j]);
            }
        }
    }
}

/// Activation rows from which the AVX2 kernels take their scales from `block_scales_256`.
pub(super) const PRODUCTS_FROM: usize = 4;

/// Whether a kernel over `M` activation rows prefetches the next tile: only for the few
/// rows of a decode step (and its speculative tokens), which read each weight once; a
/// prompt's groups of [`PROMPT_M`] rows read every weight again per group, mostly from
/// cache, and the prefetches only cost them.
const fn prefetches<const M: usize>() -> bool {
    M < PROMPT_M
}

/// `block_scales_256`'s products, written before they are read.
type BlockScales<const R: usize, const M: usize> = [[[std::mem::MaybeUninit<f32>; WIDEN]; M]; R];

/// Whether a kernel over `M` activation rows at `S` takes its scales from
/// `block_scales_256`.
const fn uses_products<S: IntIsa, const M: usize>() -> bool {
    S::PRODUCTS && M >= PRODUCTS_FROM
}

/// [`kernel`] with AVX-512 VNNI.
///
/// # Safety
/// As [`kernel`], on a CPU with AVX-512F, BW and VNNI, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn kernel_512<W: Weights<Avx512>, const R: usize, const M: usize>(
    p: &PackedQuant,
    r: usize,
    a: &[ActRow<'_>; M],
) -> [[f32; M]; R] {
    // SAFETY: this function enables `Avx512`'s features; the rest as the caller guarantees.
    unsafe { kernel::<Avx512, W, R, M>(p, r, a) }
}

/// [`kernel`] with AVX2.
///
/// # Safety
/// As [`kernel`], on a CPU with AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel_256<W: Weights<Avx2>, const R: usize, const M: usize>(
    p: &PackedQuant,
    r: usize,
    a: &[ActRow<'_>; M],
) -> [[f32; M]; R] {
    // SAFETY: this function enables `Avx2`'s features; the rest as the caller guarantees.
    unsafe { kernel::<Avx2, W, R, M>(p, r, a) }
}

/// Weight rows `r..r + R` of `p` (format `W`) × `M` q8 rows at `S`: the blocks in steps
/// of `S::STEP` (a last step of one where a group's count is odd), then the minimum terms,
/// then each accumulator's lanes summed. The rows are built here, by `W`, so they stay in
/// registers and hold only what `W` reads.
///
/// # Safety
/// The CPU must have `S`'s features (and F16C); `p` holds rows `r..r + R` and is of `W`'s
/// format, and every activation row holds `nb` scales and block terms and `32 · nb` quants.
#[inline(always)]
unsafe fn kernel<S: IntIsa, W: Weights<S>, const R: usize, const M: usize>(
    p: &PackedQuant,
    r: usize,
    a: &[ActRow<'_>; M],
) -> [[f32; M]; R] {
    // A loop, not `array::from_fn`, whose closure stayed a call that returned each row
    // through memory (measured: a third of a Q4_1 decode matmul's time).
    let mut w = [W::row(p, r); R];
    for (j, w) in w.iter_mut().enumerate().skip(1) {
        *w = W::row(p, r + j);
    }
    let w = &w;
    let mut dw = [[0f32; WIDEN]; R];
    // SAFETY: the CPU has `S`'s features (the caller guarantees).
    let mut acc = [[unsafe { S::zero() }; M]; R];
    let mut products: BlockScales<R, M> = [[[std::mem::MaybeUninit::uninit(); WIDEN]; M]; R];
    for c in (0..w[0].nb).step_by(WIDEN) {
        let n = (w[0].nb - c).min(WIDEN);
        for (row, dw) in w.iter().zip(dw.iter_mut()) {
            // SAFETY: every row's scale arrays run on past its blocks (`WeightRow`).
            unsafe { W::widen(row, c, n, dw) };
        }
        if uses_products::<S, M>() {
            // SAFETY: every activation row holds `nb >= c + n` scales; `S` has AVX2.
            unsafe { block_scales_256(&dw, a, c, n, &mut products) };
        }
        let ptrs = Ptrs::of(w, a, &dw);
        // Whole steps, then a step of the one block left where `n` is odd. Counting steps
        // keeps one induction variable; a loop on `b + 1 < c + n` kept a second one once
        // inlining showed `c` even, and that register spilled in the larger tiles.
        let steps = n / S::STEP;
        for s in 0..steps {
            let b = c + s * S::STEP;
            // SAFETY: the step's blocks are below `c + n ≤ nb`: in bounds of every row;
            // the group's products are written.
            unsafe { block_step::<S, W, R, M, true>(&ptrs, &products, b, b - c, &mut acc) };
        }
        if !n.is_multiple_of(S::STEP) {
            let b = c + steps * S::STEP;
            // SAFETY: block `b` is the group's last, below `c + n ≤ nb`.
            unsafe { block_step::<S, W, R, M, false>(&ptrs, &products, b, b - c, &mut acc) };
        }
    }
    if W::MINIMUMS {
        // SAFETY: as the caller guarantees.
        unsafe { add_min_terms::<S, W, R, M>(w, a, &mut acc) };
    }
    let mut out = [[0f32; M]; R];
    for (out, acc) in out.iter_mut().zip(&acc) {
        for (out, acc) in out.iter_mut().zip(acc) {
            // SAFETY: the CPU has `S`'s features.
            *out = unsafe { S::reduce(*acc) };
        }
    }
    out
}

/// The step from block `b` (`j = b - c` in its group; with `!FULL` block `b` alone) into
/// the group's accumulators: each block's exact integer sum per pair of rows, scaled by
/// `dw · dx`.
///
/// # Safety
/// The step's blocks must be in bounds of every row behind `ptrs`; with
/// [`uses_products`], `block_scales_256` must have written the group's products; the CPU
/// must have `S`'s features.
#[inline(always)]
unsafe fn block_step<S: IntIsa, W: Weights<S>, const R: usize, const M: usize, const FULL: bool>(
    ptrs: &Ptrs<R, M>,
    products: &BlockScales<R, M>,
    b: usize,
    j: usize,
    acc: &mut [[S::F; M]; R],
) {
    // SAFETY: as the caller guarantees.
    unsafe {
        let mut qx = [W::prepare(S::zero_int()); M];
        for (qx, aq) in qx.iter_mut().zip(&ptrs.aq) {
            *qx = W::prepare(S::load_acts::<FULL>(aq.add(b * 32)));
        }
        let mut dx = [S::zero(); M];
        for (dx, ad) in dx.iter_mut().zip(&ptrs.ad) {
            *dx = S::scales::<FULL>(ad.add(b));
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            if prefetches::<M>() {
                let ahead = ptrs.wq[r].wrapping_add(ptrs.ahead + b * W::BLOCK_BYTES);
                _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
            }
            let u = W::unpack::<FULL>(ptrs.wq[r], b);
            let dw = S::scales::<FULL>(ptrs.wd[r].add(j));
            for (i, acc) in acc.iter_mut().enumerate() {
                let dot = S::to_f32(W::dot(u, qx[i]));
                let scale = if uses_products::<S, M>() {
                    S::broadcast(products[r][i].as_ptr().add(j).cast())
                } else {
                    S::mul(dw, dx[i])
                };
                *acc = S::fmadd(dot, scale, *acc);
            }
        }
    }
}

/// Adds the minimum terms `Σ m · s` of every pair into its accumulator, `S::LANES` blocks
/// per step, the last partial step masked: one dependent scalar chain per pair would cost
/// as much as the blocks themselves.
///
/// # Safety
/// As [`kernel`].
#[inline(always)]
unsafe fn add_min_terms<S: IntIsa, W: Weights<S>, const R: usize, const M: usize>(
    w: &[WeightRow<'_>; R],
    a: &[ActRow<'_>; M],
    acc: &mut [[S::F; M]; R],
) {
    let nb = w[0].nb;
    for b in (0..nb).step_by(S::LANES) {
        // SAFETY: the activation loads are masked to blocks `b..nb`; the weight rows'
        // minimums run on past each row (`WeightRow`), so `LANES` of them from block `b`
        // are in bounds, and the mask zeroes the lanes past the row.
        unsafe {
            let mask = S::lane_mask(nb - b);
            let mut s = [S::zero(); M];
            for (s, a) in s.iter_mut().zip(a) {
                *s = S::load_masked(a.s.as_ptr().add(b), mask);
            }
            for (row, acc) in w.iter().zip(acc.iter_mut()) {
                let m = W::minimums(row, b, mask);
                for (acc, s) in acc.iter_mut().zip(&s) {
                    *acc = S::fmadd(m, *s, *acc);
                }
            }
        }
    }
}
