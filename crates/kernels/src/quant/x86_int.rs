//! AVX-512 VNNI and AVX2 integer kernels for packed Q4_0 / Q4_1 / Q8_0 rows against `q8`
//! activation rows ([`super::q8`]).
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
use super::x86::{WIDEN, scale_groups};
use super::x86_isa::{Avx2, Isa};
use super::{PackedQuant, QuantFormat, SimdLevel};

/// Most activation rows one kernel call carries (AVX-512 has registers for 2 × 8
/// accumulators plus operands).
const MAX_M: usize = 8;

/// A kernel over `R` weight rows and `M` activation rows.
type Kernel<const R: usize, const M: usize> = unsafe fn(&[WeightRow<'_>; R], &[ActRow<'_>; M]) -> [[f32; M]; R];

/// The output of one `dot_rows` call and what every tile of it shares.
struct Job<'a, 'p> {
    level: SimdLevel,
    q4: bool,
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
    let q4 = p.format() != QuantFormat::Q8_0;
    let m = x.rows();
    let mut job = Job { level, q4, p, rows, out };
    for first in (0..m).step_by(MAX_M) {
        match (m - first).min(MAX_M) {
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
        // weight rows for 1 row and 1 weight row from 4 rows up.
        let tile = match (self.level, M) {
            (SimdLevel::Avx512, ..=5) => 4,
            (SimdLevel::Avx512, 6) | (_, ..=2) => 2,
            _ => 1,
        };
        let mut r = self.rows.start;
        while r < self.rows.end {
            let left = self.rows.end - r;
            r += if tile >= 4 && left >= 4 {
                self.tile::<4, M>(r, first, &acts)
            } else if tile >= 2 && left >= 2 {
                self.tile::<2, M>(r, first, &acts)
            } else {
                self.tile::<1, M>(r, first, &acts)
            };
        }
    }

    /// Weight rows `r..r + R` against the group; returns `R`.
    fn tile<const R: usize, const M: usize>(&mut self, r: usize, first: usize, acts: &[ActRow<'_>; M]) -> usize {
        let w: [WeightRow<'_>; R] = std::array::from_fn(|j| WeightRow::of(self.p, r + j));
        let kernel: Kernel<R, M> = match (self.level, self.q4) {
            (SimdLevel::Avx512, true) => q4_512::<R, M>,
            (SimdLevel::Avx512, false) => q8_512::<R, M>,
            (_, true) => q4_256::<R, M>,
            (_, false) => q8_256::<R, M>,
        };
        // SAFETY: `dot_rows` runs only at a level the CPU has (the caller caps it at the
        // detected one, and AVX-512 here implies VNNI); every row holds `nb` scales and
        // payloads and every activation row `32 · nb` quants (checked by the caller).
        let got = unsafe { kernel(&w, acts) };
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

/// Raw views of a group's rows, read without bounds checks in the inner loops (the
/// callers of `dot_rows` checked every length once). `wd` are the weight rows' scales of
/// the current group of `WIDEN` blocks, widened to f32, indexed from the group's start.
struct Ptrs<const R: usize, const M: usize> {
    wq: [*const u8; R],
    wd: [*const f32; R],
    aq: [*const i8; M],
    ad: [*const f32; M],
}

impl<const R: usize, const M: usize> Ptrs<R, M> {
    fn of(w: &[WeightRow<'_>; R], a: &[ActRow<'_>; M], dw: &[[f32; WIDEN]; R]) -> Self {
        Self {
            wq: std::array::from_fn(|r| w[r].qs.as_ptr()),
            wd: std::array::from_fn(|r| dw[r].as_ptr()),
            aq: std::array::from_fn(|i| a[i].qs.as_ptr()),
            ad: std::array::from_fn(|i| a[i].d.as_ptr()),
        }
    }
}

/// `[d[b] × 8, d[b + 1] × 8]`, or `d[b]` in the low half for the last block of an odd
/// count (whose upper lanes multiply zero products).
///
/// # Safety
/// `d[b]` (and `d[b + 1]` when `PAIR`) must be readable; the CPU must have AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pair_scales<const PAIR: bool>(d: *const f32, b: usize) -> __m512 {
    // SAFETY: as the caller guarantees.
    unsafe {
        if PAIR {
            let two = _mm_castpd_ps(_mm_load_sd(d.add(b).cast()));
            _mm512_permutexvar_ps(
                _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                _mm512_castps128_ps512(two),
            )
        } else {
            _mm512_set1_ps(*d.add(b))
        }
    }
}

/// Loads the quants of activation blocks `b` and `b + 1` (or `b` alone, zero-extended).
///
/// # Safety
/// Block `b` (and `b + 1` when `PAIR`) of 32 bytes must be readable at `qs`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_pair<const PAIR: bool>(qs: *const i8, b: usize) -> __m512i {
    // SAFETY: as the caller guarantees.
    unsafe {
        let p = qs.add(b * 32);
        if PAIR { _mm512_loadu_si512(p.cast()) } else { _mm512_zextsi256_si512(_mm256_loadu_si256(p.cast())) }
    }
}

/// Sums the lanes of every accumulator.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce_512<const R: usize, const M: usize>(acc: &[[__m512; M]; R]) -> [[f32; M]; R] {
    std::array::from_fn(|r| std::array::from_fn(|i| _mm512_reduce_add_ps(acc[r][i])))
}

/// Adds the minimum terms `Σ m · s` of every pair into its accumulator, 16 blocks per
/// step: one dependent scalar chain per pair would cost as much as the blocks themselves.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn add_min_terms_512<const R: usize, const M: usize>(
    w: &[WeightRow<'_>; R],
    a: &[ActRow<'_>; M],
    acc: &mut [[__m512; M]; R],
) {
    let nb = w[0].nb;
    for b in (0..nb).step_by(16) {
        let mask: __mmask16 = if nb - b >= 16 { 0xFFFF } else { (1u16 << (nb - b)) - 1 };
        // SAFETY: the activation loads are masked to blocks `b..nb`; the weight rows'
        // minimums run on past each row (`WeightRow`), so 16 of them from block `b` are in
        // bounds, and the mask zeroes the lanes past the row.
        unsafe {
            let s: [__m512; M] = std::array::from_fn(|i| _mm512_maskz_loadu_ps(mask, a[i].s.as_ptr().add(b)));
            for r in 0..R {
                let m16 = _mm256_loadu_si256(w[r].m.as_ptr().add(b).cast());
                let m = _mm512_maskz_mov_ps(mask, _mm512_cvtph_ps(m16));
                for i in 0..M {
                    acc[r][i] = _mm512_fmadd_ps(m, s[i], acc[r][i]);
                }
            }
        }
    }
}

/// Q4 rows × q8 rows, two blocks (64 values) per step with `vpdpbusd`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_512<const R: usize, const M: usize>(w: &[WeightRow<'_>; R], a: &[ActRow<'_>; M]) -> [[f32; M]; R] {
    let mut dw = [[0f32; WIDEN]; R];
    let mut acc = [[_mm512_setzero_ps(); M]; R];
    let step = |dw: &[[f32; WIDEN]; R], c: usize, n: usize| {
        let ptrs = Ptrs::of(w, a, dw);
        let mut b = c;
        while b + 1 < c + n {
            // SAFETY: blocks `b` and `b + 1` are below `c + n ≤ nb`: in bounds of every row.
            unsafe { q4_step_512::<R, M, true>(&ptrs, b, b - c, &mut acc) };
            b += 2;
        }
        if b < c + n {
            // SAFETY: block `b` is below `c + n ≤ nb`: in bounds of every row.
            unsafe { q4_step_512::<R, M, false>(&ptrs, b, b - c, &mut acc) };
        }
    };
    // SAFETY: every weight row holds `nb` scales (and more past them) and `16 · nb`
    // payload bytes and every activation row `nb` scales and `32 · nb` quants; the steps
    // read blocks below `nb`, and their weight scales from the group's widened copy.
    unsafe { scale_groups(w, &mut dw, step) };
    add_min_terms_512(w, a, &mut acc);
    reduce_512(&acc)
}

/// Blocks `b` and `b + 1` (or `b` alone) of a Q4 group into its accumulators.
///
/// # Safety
/// Those blocks must be in bounds of every row behind `ptrs`; the CPU must have the
/// features below.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_step_512<const R: usize, const M: usize, const PAIR: bool>(
    ptrs: &Ptrs<R, M>,
    b: usize,
    bw: usize,
    acc: &mut [[__m512; M]; R],
) {
    let (mask, mask128) = (_mm256_set1_epi8(0x0F), _mm_set1_epi8(0x0F));
    let zero = _mm512_setzero_si512();
    // SAFETY: as the caller guarantees.
    unsafe {
        let qx: [__m512i; M] = std::array::from_fn(|i| load_pair::<PAIR>(ptrs.aq[i], b));
        let dx: [__m512; M] = std::array::from_fn(|i| pair_scales::<PAIR>(ptrs.ad[i], b));
        for (r, acc) in acc.iter_mut().enumerate() {
            let p = ptrs.wq[r].add(b * 16);
            // Lanes of 128 bits: [low nibbles of b, high nibbles of b, the same of b + 1],
            // the element order of the activation blocks.
            let u = if PAIR {
                let v = _mm256_loadu_si256(p.cast());
                let (lo, hi) = (_mm256_and_si256(v, mask), _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask));
                let t = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                _mm512_shuffle_i64x2::<0xD8>(t, t)
            } else {
                let v = _mm_loadu_si128(p.cast());
                let (lo, hi) = (_mm_and_si128(v, mask128), _mm_and_si128(_mm_srli_epi16::<4>(v), mask128));
                _mm512_zextsi256_si512(_mm256_set_m128i(hi, lo))
            };
            let dw = pair_scales::<PAIR>(ptrs.wd[r], bw);
            for ((acc, qx), dx) in acc.iter_mut().zip(&qx).zip(&dx) {
                let dot = _mm512_dpbusd_epi32(zero, u, *qx);
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, *dx), *acc);
            }
        }
    }
}

/// Q8_0 rows × q8 rows, two blocks per step with `vpdpbusd` and the sign trick.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_512<const R: usize, const M: usize>(w: &[WeightRow<'_>; R], a: &[ActRow<'_>; M]) -> [[f32; M]; R] {
    let mut dw = [[0f32; WIDEN]; R];
    let mut acc = [[_mm512_setzero_ps(); M]; R];
    let step = |dw: &[[f32; WIDEN]; R], c: usize, n: usize| {
        let ptrs = Ptrs::of(w, a, dw);
        let mut b = c;
        while b + 1 < c + n {
            // SAFETY: blocks `b` and `b + 1` are below `c + n ≤ nb`: in bounds of every row.
            unsafe { q8_step_512::<R, M, true>(&ptrs, b, b - c, &mut acc) };
            b += 2;
        }
        if b < c + n {
            // SAFETY: block `b` is below `c + n ≤ nb`: in bounds of every row.
            unsafe { q8_step_512::<R, M, false>(&ptrs, b, b - c, &mut acc) };
        }
    };
    // SAFETY: as in `q4_512`, with 32 payload bytes per weight block.
    unsafe { scale_groups(w, &mut dw, step) };
    reduce_512(&acc)
}

/// Blocks `b` and `b + 1` (or `b` alone) of a Q8_0 group into its accumulators.
///
/// # Safety
/// As `q4_step_512`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_step_512<const R: usize, const M: usize, const PAIR: bool>(
    ptrs: &Ptrs<R, M>,
    b: usize,
    bw: usize,
    acc: &mut [[__m512; M]; R],
) {
    let zero = _mm512_setzero_si512();
    // SAFETY: as the caller guarantees.
    unsafe {
        let qx: [__m512i; M] = std::array::from_fn(|i| load_pair::<PAIR>(ptrs.aq[i], b));
        let dx: [__m512; M] = std::array::from_fn(|i| pair_scales::<PAIR>(ptrs.ad[i], b));
        for (r, acc) in acc.iter_mut().enumerate() {
            let wv = load_pair::<PAIR>(ptrs.wq[r].cast(), b);
            let (u, neg) = (_mm512_abs_epi8(wv), _mm512_movepi8_mask(wv));
            let dw = pair_scales::<PAIR>(ptrs.wd[r], bw);
            for ((acc, qx), dx) in acc.iter_mut().zip(&qx).zip(&dx) {
                let s = _mm512_mask_sub_epi8(*qx, neg, zero, *qx);
                let dot = _mm512_dpbusd_epi32(zero, u, s);
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, *dx), *acc);
            }
        }
    }
}

/// Adds the minimum terms `Σ m · s` of every pair into its accumulator, 8 blocks per
/// step (as `add_min_terms_512`); the last partial step masks its lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn add_min_terms_256<const R: usize, const M: usize>(
    w: &[WeightRow<'_>; R],
    a: &[ActRow<'_>; M],
    acc: &mut [[__m256; M]; R],
) {
    let nb = w[0].nb;
    for b in (0..nb).step_by(8) {
        let left = (nb - b).min(8) as i32;
        let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        // SAFETY: the activation loads are masked to blocks `b..nb`; the weight rows'
        // minimums run on past each row (`WeightRow`), so 8 of them from block `b` are in
        // bounds, and the mask zeroes the lanes past the row.
        unsafe {
            let s: [__m256; M] = std::array::from_fn(|i| _mm256_maskload_ps(a[i].s.as_ptr().add(b), mask));
            for (wr, acc) in w.iter().zip(acc.iter_mut()) {
                let m8 = _mm_loadu_si128(wr.m.as_ptr().add(b).cast());
                let m = _mm256_and_ps(_mm256_cvtph_ps(m8), _mm256_castsi256_ps(mask));
                for (acc, s) in acc.iter_mut().zip(&s) {
                    *acc = _mm256_fmadd_ps(m, *s, *acc);
                }
            }
        }
    }
}

/// Sums the lanes of every accumulator.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn reduce_256<const R: usize, const M: usize>(acc: &[[__m256; M]; R]) -> [[f32; M]; R] {
    // SAFETY: the CPU has AVX2 (this function's features).
    std::array::from_fn(|r| std::array::from_fn(|i| unsafe { <Avx2 as Isa>::reduce(acc[r][i]) }))
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
const PRODUCTS_FROM: usize = 4;

/// `block_scales_256`'s products, written before they are read.
type BlockScales<const R: usize, const M: usize> = [[[std::mem::MaybeUninit<f32>; WIDEN]; M]; R];

/// The scale of block `b` (`j = b - c` in its group) for pair `(r, i)`, broadcast: from
/// `block_scales_256`'s products from [`PRODUCTS_FROM`] rows on, else `dw · dx`.
///
/// # Safety
/// With `M >= PRODUCTS_FROM`, `block_scales_256` must have written product `j`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn block_scale<const R: usize, const M: usize>(
    products: &BlockScales<R, M>,
    (r, i, j): (usize, usize, usize),
    dw: __m256,
    dx: __m256,
) -> __m256 {
    if M >= PRODUCTS_FROM {
        // SAFETY: as the caller guarantees.
        unsafe { _mm256_broadcast_ss(products[r][i].get_unchecked(j).assume_init_ref()) }
    } else {
        _mm256_mul_ps(dw, dx)
    }
}

/// Q4 rows × q8 rows, one block per step with `vpmaddubsw` + `vpmaddwd`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_256<const R: usize, const M: usize>(w: &[WeightRow<'_>; R], a: &[ActRow<'_>; M]) -> [[f32; M]; R] {
    let (mask, ones) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi16(1));
    // The block's 16 bytes go to both halves; the upper half shifted by a nibble, so after
    // the mask the lower half holds the low nibbles (elements 0..16) and the upper one the
    // high nibbles (16..32): three instructions instead of five.
    let nibble = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    let mut acc = [[_mm256_setzero_ps(); M]; R];
    let mut dw = [[0f32; WIDEN]; R];
    let mut products: BlockScales<R, M> = [[[std::mem::MaybeUninit::uninit(); WIDEN]; M]; R];
    let step = |dw: &[[f32; WIDEN]; R], c: usize, n: usize| {
        if M >= PRODUCTS_FROM {
            // SAFETY: every activation row holds `nb >= c + n` scales; the CPU has AVX2.
            unsafe { block_scales_256(dw, a, c, n, &mut products) };
        }
        for b in c..c + n {
            // SAFETY: block `b` of every row is in bounds (16 payload bytes per weight block,
            // 32 quants per activation block); the group's products are written.
            unsafe {
                let qx: [__m256i; M] = std::array::from_fn(|i| _mm256_loadu_si256(a[i].qs.as_ptr().add(b * 32).cast()));
                let dx: [__m256; M] = std::array::from_fn(|i| _mm256_set1_ps(*a[i].d.get_unchecked(b)));
                for r in 0..R {
                    let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(w[r].qs.as_ptr().add(b * 16).cast()));
                    let u = _mm256_and_si256(_mm256_srlv_epi32(v, nibble), mask);
                    let dw = _mm256_set1_ps(*dw[r].get_unchecked(b - c));
                    for i in 0..M {
                        let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(u, qx[i]), ones);
                        let s = block_scale(&products, (r, i, b - c), dw, dx[i]);
                        acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), s, acc[r][i]);
                    }
                }
            }
        }
    };
    // SAFETY: every row's scale array runs on past its blocks (`WeightRow`).
    unsafe { scale_groups(w, &mut dw, step) };
    add_min_terms_256(w, a, &mut acc);
    reduce_256(&acc)
}

/// Q8_0 rows × q8 rows, one block per step with the sign trick.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_256<const R: usize, const M: usize>(w: &[WeightRow<'_>; R], a: &[ActRow<'_>; M]) -> [[f32; M]; R] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); M]; R];
    let mut dw = [[0f32; WIDEN]; R];
    let mut products: BlockScales<R, M> = [[[std::mem::MaybeUninit::uninit(); WIDEN]; M]; R];
    let step = |dw: &[[f32; WIDEN]; R], c: usize, n: usize| {
        if M >= PRODUCTS_FROM {
            // SAFETY: as in `q4_256`.
            unsafe { block_scales_256(dw, a, c, n, &mut products) };
        }
        for b in c..c + n {
            // SAFETY: as in `q4_256`, with 32 payload bytes per weight block.
            unsafe {
                let qx: [__m256i; M] = std::array::from_fn(|i| _mm256_loadu_si256(a[i].qs.as_ptr().add(b * 32).cast()));
                let dx: [__m256; M] = std::array::from_fn(|i| _mm256_set1_ps(*a[i].d.get_unchecked(b)));
                for r in 0..R {
                    let wv = _mm256_loadu_si256(w[r].qs.as_ptr().add(b * 32).cast());
                    let u = _mm256_sign_epi8(wv, wv);
                    let dw = _mm256_set1_ps(*dw[r].get_unchecked(b - c));
                    for i in 0..M {
                        let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(qx[i], wv)), ones);
                        let s = block_scale(&products, (r, i, b - c), dw, dx[i]);
                        acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), s, acc[r][i]);
                    }
                }
            }
        }
    };
    // SAFETY: every row's scale array runs on past its blocks (`WeightRow`).
    unsafe { scale_groups(w, &mut dw, step) };
    reduce_256(&acc)
}
