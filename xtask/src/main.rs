//! `cargo xtask`: the one place that knows how to build, test, demo and benchmark provisioner.

mod bench;
mod bootstrap;
mod demo;
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
    /// Measure provisioner side by side with the reference ptp + host-local plugins (needs root).
    Bench {
        /// Sandboxes per sequential and per concurrent phase.
        #[arg(long, default_value_t = 100)]
        count: usize,
        /// Concurrent callers.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Sandboxes provisioned when measuring the daemon's RSS (the target is for 1000).
        #[arg(long, default_value_t = 100)]
        sandboxes: usize,
    },
    /// Build, then wire sandboxes in private namespaces and show them (needs root).
    Demo,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::BuildEbpf => ebpf::build().map(|_| ()),
        Command::Test {
            cargo_test_args,
            no_lint,
        } => test::run(&cargo_test_args, !no_lint),
        Command::Bench {
            count,
            concurrency,
            sandboxes,
        } => bench::run(&bench::Options {
            count,
            concurrency,
            sandboxes,
        }),
        Command::Demo => demo::run(),
    }
}
