//! `cargo xtask`: the one place that knows how to build, test, demo and benchmark provisioner.

mod bench;
mod bootstrap;
mod demo;
mod ebpf;
mod fuzz;
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
        /// Sandboxes of the sequential phases (ADD of each, then DEL of each), per way.
        #[arg(long, default_value_t = 100)]
        count: usize,
        /// Concurrent callers.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// ADDs (then DELs) of the concurrent phase, per way.
        #[arg(long, default_value_t = 400)]
        concurrent_count: usize,
        /// Sandboxes provisioned when measuring the daemon's RSS (the target is for 1000).
        #[arg(long, default_value_t = 100)]
        sandboxes: usize,
        /// Calls per way per block of a sequential phase; ways alternate block by block.
        #[arg(long, default_value_t = 50)]
        block: usize,
        /// Write every figure to this JSON file (default target/bench/latest.json).
        #[arg(long)]
        json: Option<std::path::PathBuf>,
        /// Skip the components measured alone (allocator, dataplane).
        #[arg(long)]
        no_components: bool,
        /// Run the daemon without its kernel watch (eBPF tracing), to see what tracing costs.
        #[arg(long)]
        no_trace: bool,
    },
    /// Build, then wire sandboxes in private namespaces and show them (needs root).
    Demo,
    /// Build the binary to install (LTO, statically linked: the fastest CNI plugin start).
    BuildRelease,
    /// Run every fuzz target (fuzz/, installs cargo-fuzz when missing) for N seconds each.
    Fuzz {
        /// Fuzzing time per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Only this target.
        #[arg(long)]
        target: Option<String>,
    },
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
            concurrent_count,
            sandboxes,
            block,
            json,
            no_components,
            no_trace,
        } => bench::run(&bench::Options {
            count,
            concurrency,
            concurrent_count,
            sandboxes,
            block,
            json,
            no_components,
            no_trace,
        }),
        Command::Demo => demo::run(),
        Command::BuildRelease => bench::build_dist().map(|bin| println!("{}", bin.display())),
        Command::Fuzz { seconds, target } => fuzz::run(&fuzz::Options { seconds, target }),
    }
}
