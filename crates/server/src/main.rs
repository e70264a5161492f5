//! `met`: the command-line entry point (see the `met_server` library).

fn main() -> std::process::ExitCode {
    met_server::main()
}
