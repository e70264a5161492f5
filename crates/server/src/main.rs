//! `met`: the command-line entry point (see the `met_server` library).

/// The CPU backend allocates every op's output afresh; mimalloc keeps freed pages for the
/// next op, where glibc's allocator returns large blocks to the OS. CPU decode measured
/// 1.12× glibc's (`bench/results/cpu-gemm-avx512-2026-12-02/`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    met_server::main()
}
