//! `veil-shard`: the process inside a shard's confidential VM (the command
//! line lives in `veil_enclave::cli`).

fn main() -> std::process::ExitCode {
    veil_enclave::cli::main()
}
