//! `met`: the command-line entry point (see the `met_server` library).

/// The CPU backend allocates every op's output afresh; mimalloc reuses freed pages where
/// glibc's allocator returns large blocks to the OS and faults them in again at the next
/// op (measured in `bench/results/cpu-gemm-avx512-2026-12-02/`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    met_server::main()
}
