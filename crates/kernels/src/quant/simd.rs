//! Which SIMD kernels the quantised products run on this CPU, decided once per process.
//!
//! Detection picks the widest level the CPU has; the environment variable `MET_CPU_SIMD`
//! (`avx512`, `avx2` or `none`) lowers it, so a machine with AVX-512 can run, measure and
//! test the AVX2 kernels that an AVX2-only machine would use. A request above what the CPU
//! has is capped at what it has, never trusted: running an instruction the CPU lacks is
//! undefined behaviour. Tests that must cover every level call the kernels with an explicit
//! level instead (see [`SimdLevel::available`]).

use std::sync::OnceLock;

/// A family of SIMD kernels, ordered from narrowest to widest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimdLevel {
    /// Portable Rust only.
    None,
    /// AVX2 with FMA and F16C.
    Avx2,
    /// AVX-512 (F and BW); the integer kernels also need VNNI, else they use AVX2.
    Avx512,
}

impl SimdLevel {
    /// The level the kernels use: detected once, lowered by `MET_CPU_SIMD`.
    pub fn current() -> Self {
        static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
        *LEVEL.get_or_init(|| {
            let detected = Self::detected();
            match std::env::var("MET_CPU_SIMD").ok().as_deref().and_then(Self::parse) {
                Some(asked) => asked.min(detected),
                None => detected,
            }
        })
    }

    /// Every level this CPU can run, narrowest first.
    pub fn available() -> Vec<Self> {
        [Self::None, Self::Avx2, Self::Avx512].into_iter().filter(|l| *l <= Self::detected()).collect()
    }

    /// The level of the integer (`q8` activation) kernels: AVX-512 only with VNNI, whose
    /// `vpdpbusd` they are built on.
    pub(super) fn for_int8(self) -> Self {
        if self == Self::Avx512 && !has_vnni() { Self::Avx2 } else { self }
    }

    fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" | "scalar" => Some(Self::None),
            "avx2" => Some(Self::Avx2),
            "avx512" => Some(Self::Avx512),
            _ => None,
        }
    }

    /// The widest level this CPU has.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn detected() -> Self {
        let avx2 =
            is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
        let avx512 = is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw");
        match (avx2, avx512) {
            (true, true) => Self::Avx512,
            (true, false) => Self::Avx2,
            _ => Self::None,
        }
    }

    /// The widest level this CPU has.
    #[cfg(not(target_arch = "x86_64"))]
    pub(super) fn detected() -> Self {
        Self::None
    }
}

#[cfg(target_arch = "x86_64")]
fn has_vnni() -> bool {
    is_x86_feature_detected!("avx512vnni")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_vnni() -> bool {
    false
}
