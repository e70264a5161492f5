//! Rules every CUDA kernel source must keep, checked on the text, so they hold on machines
//! without a GPU (CI) too.
//!
//! Programmatic dependent launch: the CUDA backend launches every kernel allowed to start
//! before the kernel ahead of it has finished (`launch_raw` in `src/cuda/mod.rs`). That is
//! correct only if each kernel waits for its predecessor (`pdl_wait_prev`, `common.cuh`)
//! before it touches shared memory; one kernel without the wait would race with the one
//! before it and break the ordering of every kernel after it.

use std::path::Path;

/// The brace-matched block of `src` that opens at byte `open`.
fn block(src: &str, open: usize) -> &str {
    let mut depth = 0usize;
    for (i, c) in src[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &src[open..=open + i];
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced braces after byte {open}")
}

/// Each `extern "C" __global__` function of `src`: its name and its body's text.
fn kernels(src: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = src[from..].find("extern \"C\" __global__").map(|i| from + i) {
        let open = at + src[at..].find('{').expect("a kernel has a body");
        let mut head = src[at..open].to_string();
        if let Some(lb) = head.find("__launch_bounds__(") {
            let close = lb + head[lb..].find(')').expect("launch bounds close");
            head.replace_range(lb..=close, "");
        }
        let name = head[..head.find('(').expect("a parameter list")].split_whitespace().last().expect("a name");
        let body = block(src, open);
        out.push((name.to_string(), body.to_string()));
        from = open + body.len();
    }
    out
}

fn source(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A kernel body's first statement onwards: macro bodies skip their line continuations too.
fn from_first_statement(body: &str) -> &str {
    body[1..].trim_start_matches(|c: char| c.is_whitespace() || c == '\\')
}

/// Asserts that the device function `dots` of `src` (`file`) requests its weights
/// (`load`), then waits for the kernel before it, then reads x (`x`).
fn weights_then_wait_then_x(src: &str, file: &str, dots: &str, load: &str, x: &str) {
    let body = function_body(src, dots);
    let at = |needle: &str| body.find(needle).unwrap_or_else(|| panic!("{file} `{dots}`: no `{needle}`"));
    let (load, wait, x) = (at(load), at("pdl_wait_prev();"), at(x));
    assert!(load < wait && wait < x, "{file} `{dots}`: weights, then the wait, then x");
}

/// The body of the device function `name`: its definition is the first ` name(`.
fn function_body<'a>(src: &'a str, name: &str) -> &'a str {
    let at = src.find(&format!(" {name}(")).unwrap_or_else(|| panic!("no function `{name}`"));
    block(src, at + src[at..].find('{').expect("a body"))
}

#[test]
fn every_kernel_waits_for_the_kernel_before_it() {
    let mut seen = 0;
    for file in ["dense.cu", "attention.cu", "flash.cu", "moe.cu", "sample.cu", "recurrent.cu", "lora.cu", "gguf.cu"] {
        for (name, body) in kernels(&source(file)) {
            seen += 1;
            let first = from_first_statement(&body);
            // The GGUF int8 GEMVs wait inside their dot loop (below).
            let waits_later = file == "gguf.cu" && name.contains("_q8_m") && first.starts_with("pdl_allow_next();");
            assert!(
                first.starts_with("pdl_enter();") || waits_later,
                "{file}: kernel `{name}` must begin with `pdl_enter();`, before any early return"
            );
        }
    }
    // The GGUF int8 GEMVs request their first units, then wait, then read x; their kernels
    // return early only after the dots.
    let gguf = source("gguf.cu");
    weights_then_wait_then_x(&gguf, "gguf.cu", "gguf_q8_lane", "gguf_load<F>", "gguf_q8_unit<");
    assert!(function_body(&gguf, "gguf_dots_q8").contains("gguf_q8_lane<"), "gguf.cu `gguf_dots_q8` runs gguf_q8_lane");
    for f in ["gguf_gemv_q8", "gguf_gemv_q8_silu"] {
        let body = function_body(&gguf, f);
        let dots = body.find("gguf_dots_q8<").unwrap_or_else(|| panic!("gguf.cu `{f}` computes through gguf_dots_q8"));
        assert!(
            body.find("return").is_none_or(|r| r > dots),
            "gguf.cu `{f}`: an early return before gguf_dots_q8 would skip its wait"
        );
    }
    // The decode GEMVs request their first weights before waiting; the wait is in the
    // shared dot loop, which every thread of every block runs (no early return).
    let gemv = source("gemv.cu");
    let wrappers = kernels(&gemv);
    assert_eq!(wrappers.len(), 2, "the two kernel macros of gemv.cu");
    for (name, body) in &wrappers {
        let first = from_first_statement(body);
        assert!(first.starts_with("pdl_allow_next();"), "gemv.cu: `{name}` must begin with `pdl_allow_next();`");
    }
    weights_then_wait_then_x(&gemv, "gemv.cu", "gemv_dots", "fetch(t, next);", "xv +");
    for f in ["gemv", "gemv_silu"] {
        let body = function_body(&gemv, f);
        assert!(!body.contains("return"), "gemv.cu `{f}`: an early return would skip the wait in gemv_dots");
        assert!(body.contains("gemv_dots<"), "gemv.cu `{f}` computes through gemv_dots");
    }
    assert!(seen >= 20, "found only {seen} kernels: is the parser still right?");
}

#[test]
fn the_parser_finds_bodies_with_nested_braces() {
    let src = "extern \"C\" __global__ void __launch_bounds__(128) k(int a) { if (a) { x(); } y(); }\n\
               extern \"C\" __global__ void j() { pdl_enter(); }";
    let found = kernels(src);
    assert_eq!(found.len(), 2);
    assert_eq!(found[0].0, "k");
    assert_eq!(found[0].1, "{ if (a) { x(); } y(); }");
    assert_eq!(found[1], ("j".to_string(), "{ pdl_enter(); }".to_string()));
}
