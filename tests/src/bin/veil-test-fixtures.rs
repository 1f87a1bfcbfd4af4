//! Test inputs for the project's scripts, written to files.
//!
//! `veil-test-fixtures ovmf-with-kernel-hashes OUT`: a fabricated OVMF-shaped
//! firmware image with an SNP_KERNEL_HASHES section (see
//! [`veil_tests::firmware::ovmf`]). It boots nothing; `scripts/check-cvm-cluster.sh`
//! uses it, when no AmdSev OVMF is given, to compare `veil measure` with
//! `sev-snp-measure` over the real kernel, initrd and command line it booted.

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [what, out] if what == "ovmf-with-kernel-hashes" => {
            if let Err(e) = std::fs::write(out, veil_tests::firmware::ovmf(true)) {
                eprintln!("veil-test-fixtures: writing {out}: {e}");
                return std::process::ExitCode::FAILURE;
            }
            std::process::ExitCode::SUCCESS
        }
        _ => {
            eprintln!("usage: veil-test-fixtures ovmf-with-kernel-hashes OUT");
            std::process::ExitCode::from(2)
        }
    }
}
