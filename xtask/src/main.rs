//! `cargo xtask`: the one place that knows how to build, test, demo and benchmark provisioner.

mod bootstrap;
mod ebpf;
mod step;
mod test;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Build, test and demo provisioner")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build the eBPF programs (installs rust-src and bpf-linker first when missing).
    BuildEbpf,
    /// Install prerequisites, build everything, run fmt, clippy and every test (needs root).
    Test {
        /// Extra arguments passed to `cargo test` (after `--`).
        #[arg(last = true)]
        cargo_test_args: Vec<String>,
        /// Skip `cargo fmt --check` and clippy.
        #[arg(long)]
        no_lint: bool,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::BuildEbpf => ebpf::build().map(|_| ()),
        Command::Test {
            cargo_test_args,
            no_lint,
        } => test::run(&cargo_test_args, !no_lint),
    }
}
