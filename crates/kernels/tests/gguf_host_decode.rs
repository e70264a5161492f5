//! The decoders of `cuda/gguf.cu` compiled for the host and checked weight by weight, so a
//! wrong byte, shift or chunk order in them fails on machines without a GPU (CI) too.
//!
//! The part of `gguf.cu` before its kernels (`gguf_load`, `gguf_decode`, `gguf_chunk_k`,
//! a GEMV lane's share `gguf_gemv_lane` and its int8 form `gguf_q8_lane`,
//! `gguf_widen_unit`) is plain arithmetic on 16-byte words but for one PTX byte permute;
//! `host_cuda/shims.h` supplies that and the CUDA names, and `host_cuda/gguf_decode.cpp`
//! compares every weight the decoders give with a byte-by-byte reading of the regions, the
//! lanes' dot products with f64 ones and the widened rows with the weights in bf16. A copy
//! with one shift moved, or a lane that loads the wrong unit, must fail.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where what the host can run ends in `gguf.cu`: the decoders, the GEMV lane's share and
/// the widening of a unit come before the kernels (shuffles, shared memory, `mma`).
const END: &str = "// Block of GGUF_WARPS warps, warp w owning matrix row";

/// The byte permute as `gguf.cu` writes it, and as the host shim calls it.
const PRMT_ASM: &str = r#"asm("prmt.b32 %0, %1, %2, %3;" : "=r"(v) : "r"(word), "r"(0x4b000000u), "r"(0x7440u + i));"#;
const PRMT_CALL: &str = "v = prmt(word, 0x4b000000u, 0x7440u + i);";

/// The f16 conversion as `gguf.cu` writes it, and as the host shim calls it.
const H2F_ASM: &str =
    r#"asm("{\n\t.reg .b16 a;\n\tcvt.u16.u32 a, %1;\n\tcvt.f32.f16 %0, a;\n\t}" : "=f"(v) : "r"(h));"#;
const H2F_CALL: &str = "v = cvt_f32_f16(h);";

/// The host-runnable part of `src`.
fn host_source(src: &str) -> String {
    let end = src.find(END).expect("gguf.cu keeps its decoders and lane functions before the kernels");
    assert!(src[..end].contains(PRMT_ASM), "gguf.cu's byte permute changed: update the host shim");
    assert!(src[..end].contains(H2F_ASM), "gguf.cu's f16 conversion changed: update the host shim");
    format!("#include \"shims.h\"\n{}", src[..end].replace(PRMT_ASM, PRMT_CALL).replace(H2F_ASM, H2F_CALL))
}

/// Builds the check against `decoders` in a fresh directory and runs it: its exit status
/// and output.
fn run_check(decoders: &str, tag: &str) -> (bool, String) {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("host_cuda");
    let dir: PathBuf = std::env::temp_dir().join(format!("met-gguf-host-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    std::fs::write(dir.join("k.h"), decoders).expect("k.h");
    std::fs::copy(here.join("shims.h"), dir.join("shims.h")).expect("shims.h");
    let exe = dir.join("check");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let built = Command::new(&cxx)
        .args(["-O1", "-std=c++17", "-I"])
        .arg(&dir)
        .arg(here.join("gguf_decode.cpp"))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("running the C++ compiler `{cxx}`: {e}"));
    assert!(built.status.success(), "compiling the host check: {}", String::from_utf8_lossy(&built.stderr));
    let ran = Command::new(&exe).output().expect("running the host check");
    let _ = std::fs::remove_dir_all(&dir);
    (ran.status.success(), String::from_utf8_lossy(&ran.stdout).into_owned())
}

#[test]
fn gguf_decoders_give_every_weight_of_every_format() {
    let src = include_str!("../cuda/gguf.cu");
    let (ok, out) = run_check(&host_source(src), "good");
    assert!(ok && out.contains("bad 0"), "gguf.cu's decoders on the host:\n{out}");
    for format in 0..5 {
        assert!(out.contains(&format!("format {format} checked")), "format {format} was not checked:\n{out}");
    }
    for format in [2, 4] {
        assert!(out.contains(&format!("int8 format {format} checked")), "int8 lanes of {format} unchecked:\n{out}");
    }
}

#[test]
fn a_moved_shift_in_the_decoders_is_caught() {
    let good = host_source(include_str!("../cuda/gguf.cu"));
    let shift = ">> (2 * c)) & 0x03030303u";
    assert!(good.contains(shift), "the Q6_K high bits' shift moved: update this variant");
    let broken = good.replace(shift, ">> (2 * (c ^ 1))) & 0x03030303u");
    let (ok, out) = run_check(&broken, "shift");
    assert!(!ok && !out.contains("bad 0"), "a Q6_K decoder reading the wrong high bits passed:\n{out}");
}

#[test]
fn a_gemv_lane_prefetching_the_wrong_unit_is_caught() {
    let good = host_source(include_str!("../cuda/gguf.cu"));
    let prefetch = "next = gguf_load<F>(mat, row, u + 32);";
    assert!(good.contains(prefetch), "the GEMV lane's prefetch moved: update this variant");
    let (ok, out) = run_check(&good.replace(prefetch, "next = gguf_load<F>(mat, row, u);"), "prefetch");
    assert!(!ok && !out.contains("bad 0"), "a GEMV lane summing one unit twice passed:\n{out}");
}

#[test]
fn an_int8_lane_refilling_the_wrong_unit_is_caught() {
    let good = host_source(include_str!("../cuda/gguf.cu"));
    let refill = "next[r] = gguf_load<F>(mat, rows[r], u + 32);";
    assert!(good.contains(refill), "the int8 lane's prefetch moved: update this variant");
    let (ok, out) = run_check(&good.replace(refill, "next[r] = gguf_load<F>(mat, rows[r], u);"), "refill");
    assert!(!ok && !out.contains("bad 0"), "an int8 lane summing the wrong units passed:\n{out}");
}
