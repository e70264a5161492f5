//! Run-time compilation of the CUDA C kernels in `crates/kernels/cuda/` by NVRTC, with a
//! disk cache.
//!
//! The sources are embedded in the binary and compiled as one translation unit (common
//! header first) straight to machine code (CUBIN) for the device's architecture: `sm_90a` on
//! Hopper (the `a` targets unlock the architecture's own instructions), `sm_XY` before it.
//! The CUBIN is cached under `<met home>/kernels/`, keyed by a hash of the sources, the
//! options, the architecture and the NVRTC version, so a changed kernel, another GPU or
//! another NVRTC never loads a stale image. The cache is an optimisation only: a missing
//! home or an unwritable directory just means compiling every time. A compile error is an
//! [`Error::Device`] carrying NVRTC's log.

use std::ffi::{CStr, CString, c_char};
use std::path::{Path, PathBuf};
use std::time::Instant;

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

use crate::error::{Error, Result};

/// The kernel sources, in the order they are concatenated.
const SOURCES: [(&str, &str); 13] = [
    ("common.cuh", include_str!("../../cuda/common.cuh")),
    ("dense.cu", include_str!("../../cuda/dense.cu")),
    ("gemv.cu", include_str!("../../cuda/gemv.cu")),
    ("attention.cu", include_str!("../../cuda/attention.cu")),
    ("flash.cu", include_str!("../../cuda/flash.cu")),
    ("flash_wgmma.cu", include_str!("../../cuda/flash_wgmma.cu")),
    ("flash_decode.cu", include_str!("../../cuda/flash_decode.cu")),
    ("moe.cu", include_str!("../../cuda/moe.cu")),
    ("sample.cu", include_str!("../../cuda/sample.cu")),
    ("recurrent.cu", include_str!("../../cuda/recurrent.cu")),
    ("lora.cu", include_str!("../../cuda/lora.cu")),
    ("fp8.cu", include_str!("../../cuda/fp8.cu")),
    ("gguf.cu", include_str!("../../cuda/gguf.cu")),
];

/// Options every compile uses, besides the architecture.
const OPTIONS: [&str; 1] = ["--std=c++17"];

/// The environment variable that selects a [`FAULTS`] variant.
pub(crate) const FAULT_VAR: &str = "MET_TEST_FAULT";

/// Deliberately wrong kernel variants, each a preprocessor define the kernels honour: the
/// tests of the tests. The GPU precision gate (`scripts/gpu_gate.py`) runs met once with
/// `MET_TEST_FAULT=<name>` and must see it fail; a normal run never sets the variable and
/// compiles none of them.
const FAULTS: [(&str, &str); 4] = [
    // Attention ignores the keys of the sequence's last KV block (when it has more than one):
    // the most recent 1 to 16 tokens of every decode row drop out of view.
    ("drop-last-kv-block", "-DMET_FAULT_DROP_LAST_KV_BLOCK"),
    // The causal convolution of linear-attention layers forgets the window its state slot
    // kept: each chunk of a prompt, and each decode step, starts from zeros.
    ("drop-conv-state", "-DMET_FAULT_DROP_CONV_STATE"),
    // e4m3 weights are uploaded with every other scale doubled (of the 128 x 128 blocks
    // along a row block, or of the rows): `cuda/fp8.rs` reads it on the host; the define
    // changes no kernel.
    ("fp8-wrong-scale", "-DMET_FAULT_FP8_WRONG_SCALE"),
    // Attention over e4m3 KV pools reads the values under the keys' scale: `cuda/attention.rs`
    // reads it on the host; the define changes no kernel.
    ("fp8-kv-wrong-scale", "-DMET_FAULT_FP8_KV_WRONG_SCALE"),
];

/// The fault variant `MET_TEST_FAULT` asks for: `None` when unset or empty.
///
/// # Errors
/// [`Error::InvalidArgument`] for a name that is not in [`FAULTS`].
pub(crate) fn requested_fault() -> Result<Option<&'static str>> {
    let Some(name) = std::env::var_os(FAULT_VAR).filter(|v| !v.is_empty()) else { return Ok(None) };
    let name = name.to_string_lossy();
    FAULTS.iter().find(|(n, _)| *n == name).map(|&(n, _)| Some(n)).ok_or_else(|| {
        let known: Vec<&str> = FAULTS.iter().map(|(n, _)| *n).collect();
        Error::InvalidArgument(format!("{FAULT_VAR}={name}: no such fault (known: {})", known.join(", ")))
    })
}

/// The compile options for `arch` with the `fault` variant, if any.
fn options(arch: &str, fault: Option<&str>) -> Vec<String> {
    let mut options: Vec<String> = OPTIONS.iter().map(|s| (*s).to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    options.extend(FAULTS.iter().filter(|(n, _)| Some(*n) == fault).map(|(_, define)| (*define).to_string()));
    options
}

/// How the kernel image was obtained, for the startup log.
#[derive(Debug, Clone)]
pub(crate) enum Origin {
    /// Read from the disk cache.
    CacheHit(PathBuf),
    /// Compiled now, taking `seconds`; stored at the path when the cache is writable.
    Compiled { seconds: f64, stored: Option<PathBuf> },
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::CacheHit(path) => write!(f, "kernel cache hit ({})", path.display()),
            Self::Compiled { seconds, stored: Some(path) } => {
                write!(f, "kernels compiled in {seconds:.2} s, cached at {}", path.display())
            }
            Self::Compiled { seconds, stored: None } => write!(f, "kernels compiled in {seconds:.2} s (not cached)"),
        }
    }
}

/// The full source of the kernel module.
pub(crate) fn source() -> String {
    let mut src = String::new();
    for (name, text) in SOURCES {
        src.push_str(&format!("// ---- {name} ----\n"));
        src.push_str(text);
        src.push('\n');
    }
    src
}

/// The NVRTC target for compute capability `major.minor`.
pub(crate) fn arch_for(major: i32, minor: i32) -> String {
    if major >= 9 { format!("sm_{major}{minor}a") } else { format!("sm_{major}{minor}") }
}

/// NVRTC's version, as `(major, minor)`.
pub(crate) fn nvrtc_version() -> Result<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both pointers address live integers.
    unsafe { nvrtc_sys::nvrtcVersion(&raw mut major, &raw mut minor) }.result().map_err(nvrtc_err)?;
    Ok((major, minor))
}

/// The CUBIN of the kernels for `arch`, from the cache under `cache_dir` when present.
///
/// # Errors
/// When NVRTC fails, with its log.
pub(crate) fn kernel_image(arch: &str, fault: Option<&str>, cache_dir: Option<&Path>) -> Result<(Vec<u8>, Origin)> {
    let src = source();
    let version = nvrtc_version()?;
    let options = options(arch, fault);
    let key = cache_key(&src, &options, version);
    let path = cache_dir.map(|d| d.join(format!("met-{key:016x}-{arch}-nvrtc{}.{}.cubin", version.0, version.1)));
    if let Some(path) = &path
        && let Ok(image) = std::fs::read(path)
        && !image.is_empty()
    {
        return Ok((image, Origin::CacheHit(path.clone())));
    }
    let start = Instant::now();
    let image = compile(&src, &options)?;
    let seconds = start.elapsed().as_secs_f64();
    let stored = path.filter(|p| store(p, &image).is_ok());
    Ok((image, Origin::Compiled { seconds, stored }))
}

/// FNV-1a over everything that determines the image: the source, the options (which name
/// the architecture and any fault variant) and the NVRTC version.
fn cache_key(src: &str, options: &[String], (major, minor): (i32, i32)) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let parts = [src, &format!("nvrtc {major}.{minor}"), &options.join(" ")];
    for part in parts {
        for &b in part.as_bytes().iter().chain(&[0xff]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Writes the image atomically (a temporary file renamed into place), so a concurrent
/// reader never sees a partial file.
fn store(path: &Path, image: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp =
        dir.join(format!(".{}.{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("k"), std::process::id()));
    std::fs::write(&tmp, image)?;
    std::fs::rename(&tmp, path)
}

/// Compiles `src` with `options` (which name the architecture) to a CUBIN.
fn compile(src: &str, options: &[String]) -> Result<Vec<u8>> {
    let arch = options.iter().find_map(|o| o.strip_prefix("--gpu-architecture=")).unwrap_or("?");
    let c_src = CString::new(src).map_err(|_| Error::Device("kernel source holds a NUL byte".into()))?;
    let name = CString::new("met_kernels.cu").expect("no NUL");
    let prog = nvrtc::create_program(&c_src, Some(&name)).map_err(nvrtc_err)?;
    let program = Program(prog);
    // SAFETY: `prog` is a live program; the options are valid strings.
    if let Err(e) = unsafe { nvrtc::compile_program(program.0, options) } {
        // SAFETY: the program is live; the log is NUL-terminated.
        let log = unsafe { nvrtc::get_program_log(program.0) }.map(|l| c_string(&l)).unwrap_or_default();
        return Err(Error::Device(format!("NVRTC failed to compile the met kernels for {arch} ({e:?}):\n{log}")));
    }
    let mut size = 0usize;
    // SAFETY: the program compiled; `size` receives the image size.
    unsafe { nvrtc_sys::nvrtcGetCUBINSize(program.0, &raw mut size) }.result().map_err(nvrtc_err)?;
    let mut image = vec![0u8; size];
    // SAFETY: `image` holds exactly the `size` bytes NVRTC reported.
    unsafe { nvrtc_sys::nvrtcGetCUBIN(program.0, image.as_mut_ptr().cast::<c_char>()) }.result().map_err(nvrtc_err)?;
    Ok(image)
}

/// Destroys the NVRTC program however compilation ends.
struct Program(nvrtc_sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by `create_program` and is destroyed once.
        let _ = unsafe { nvrtc::destroy_program(self.0) };
    }
}

fn c_string(bytes: &[c_char]) -> String {
    // SAFETY: NVRTC's log is NUL-terminated within the buffer it sized.
    unsafe { CStr::from_ptr(bytes.as_ptr()) }.to_string_lossy().into_owned()
}

fn nvrtc_err(e: nvrtc::NvrtcError) -> Error {
    Error::Device(format!("NVRTC: {e:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names_unlock_hopper_instructions() {
        assert_eq!(arch_for(9, 0), "sm_90a");
        assert_eq!(arch_for(8, 6), "sm_86");
        assert_eq!(arch_for(10, 0), "sm_100a");
    }

    #[test]
    fn the_cache_key_changes_with_source_arch_and_version() {
        let hopper = options("sm_90a", None);
        let base = cache_key("a", &hopper, (13, 0));
        assert_ne!(base, cache_key("b", &hopper, (13, 0)));
        assert_ne!(base, cache_key("a", &options("sm_89", None), (13, 0)));
        assert_ne!(base, cache_key("a", &hopper, (13, 1)));
        assert_ne!(base, cache_key("a", &options("sm_90a", Some("drop-last-kv-block")), (13, 0)));
        assert_eq!(base, cache_key("a", &hopper, (13, 0)));
    }

    #[test]
    fn only_a_named_fault_adds_its_define() {
        assert!(!options("sm_90a", None).iter().any(|o| o.starts_with("-DMET_FAULT")));
        let faulty = options("sm_90a", Some("drop-last-kv-block"));
        assert!(faulty.contains(&"-DMET_FAULT_DROP_LAST_KV_BLOCK".to_string()), "{faulty:?}");
        assert!(!options("sm_90a", Some("no-such-fault")).iter().any(|o| o.starts_with("-DMET_FAULT")));
    }

    /// Compiles the real kernels when NVRTC can be loaded (on a machine with CUDA, or with
    /// `libnvrtc` on `LD_LIBRARY_PATH`: NVRTC needs no GPU), and checks the cache round trip
    /// and that a compile error carries NVRTC's log.
    #[test]
    fn kernels_compile_and_cache_when_nvrtc_is_present() {
        // SAFETY: only probes whether the library loads.
        if !unsafe { nvrtc_sys::is_culib_present() } {
            eprintln!("note: skipped: NVRTC is not installed");
            return;
        }
        let dir = std::env::temp_dir().join(format!("met-kernel-cache-test-{}", std::process::id()));
        let (image, origin) = kernel_image("sm_90a", None, Some(&dir)).expect("the kernels compile");
        assert!(!image.is_empty() && matches!(origin, Origin::Compiled { stored: Some(_), .. }), "{origin}");
        let (again, origin) = kernel_image("sm_90a", None, Some(&dir)).unwrap();
        assert!(matches!(origin, Origin::CacheHit(_)), "{origin}");
        assert_eq!(again, image);
        let (faulty, _) = kernel_image("sm_90a", Some("drop-last-kv-block"), Some(&dir)).expect("the fault compiles");
        assert_ne!(faulty, image, "the fault variant compiles to another image");
        let _ = std::fs::remove_dir_all(&dir);
        let err =
            compile("extern \"C\" __global__ void k() { undefined_thing(); }", &options("sm_90a", None)).unwrap_err();
        assert!(err.to_string().contains("undefined_thing"), "{err}");
    }
}
