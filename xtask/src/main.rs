//! `cargo xtask`: the one place that knows how to build, test, demo and benchmark provisioner.

mod bench;
mod bootstrap;
mod demo;
mod ebpf;
mod failpoint_check;
mod fuzz;
mod image;
mod matrix;
mod mutants;
mod release;
mod soak;
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
        /// Rounds of the tracer's cost (a daemon each, its kernel watch on and off).
        #[arg(long, default_value_t = 16)]
        rounds: usize,
        /// Longest wait, in seconds, for a quiet machine before a timed part (a third of it in
        /// the tracer's rounds); the part is then timed anyway, with a note. 0: look once.
        #[arg(long, default_value_t = 30)]
        quiet_wait: u64,
        /// Write every figure to this JSON file (default target/bench/latest.json).
        #[arg(long)]
        json: Option<std::path::PathBuf>,
        /// Run the daemon without its kernel watch (eBPF tracing); skips the tracer's rounds.
        #[arg(long)]
        no_trace: bool,
        /// Only measure what tracing costs (sendto CPU and ADD latency, tracing on vs off).
        #[arg(long)]
        trace_overhead_only: bool,
        /// Measure this provisioner binary instead of building one.
        #[arg(long)]
        bin: Option<std::path::PathBuf>,
    },
    /// The tracer's rows pooled over several runs of `bench` (their `--json` files): each
    /// run's figure, and one figure with an interval that covers how runs differ.
    BenchPool {
        /// JSON files written by `cargo xtask bench` (with or without --trace-overhead-only),
        /// all of one binary.
        #[arg(num_args = 2.., required = true)]
        files: Vec<std::path::PathBuf>,
    },
    /// Build, then wire sandboxes in private namespaces and show them (needs root).
    Demo,
    /// ADD+DEL cycles against the daemon (tracing on) with a sample per window: resident
    /// memory, fds, threads, store file size, node link count, ADD latency (needs root).
    Soak {
        /// ADD+DEL cycles in all.
        #[arg(long, default_value_t = 20_000)]
        cycles: usize,
        /// Concurrent callers.
        #[arg(long, default_value_t = 16)]
        callers: usize,
        /// Cycles per sample.
        #[arg(long, default_value_t = 1_000)]
        every: usize,
        /// Soak this provisioner binary instead of building one.
        #[arg(long)]
        bin: Option<std::path::PathBuf>,
    },
    /// Build the binary to install (LTO, statically linked: the fastest CNI plugin start).
    BuildRelease,
    /// Build the container image archive (the static binary only) for `ctr images import`,
    /// `podman load` or `docker load`; prints its path.
    Image,
    /// Mutation testing (cargo-mutants) of the modules unit-tested without root; see
    /// docs/testing.md.
    Mutants {
        /// Files to mutate (globs relative to the workspace; repeatable). Default: cni/,
        /// config/, ipam/range.rs, ipam/config.rs, trace/{netlink_parse,verdict,events}.rs.
        #[arg(long)]
        file: Vec<String>,
        /// Upper bound on one mutant's test run, in seconds.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
        /// Mutants built and tested at once.
        #[arg(long, default_value_t = 1)]
        jobs: usize,
        /// Extra arguments for cargo-mutants (after `--`), e.g. `--iterate`, `--list`.
        #[arg(last = true)]
        extra: Vec<String>,
    },
    /// The kernel-level tests on Debian's 5.10, 6.1 and 6.12 kernels (fetched from its
    /// registry, booted under qemu with virtme-ng) and on this host, with its backends and
    /// with those of older kernels forced; the report is docs/install.md's kernel table.
    KernelMatrix {
        /// Only this kernel series (repeatable), e.g. `--series 5.10`.
        #[arg(long = "series")]
        series: Vec<String>,
        /// Skip the host's runs.
        #[arg(long)]
        no_host: bool,
        /// Factor on the tests' waits and deadlines in the VMs (software emulation).
        #[arg(long, default_value_t = matrix::DEFAULT_TIME_SCALE)]
        time_scale: f64,
        /// Longest a kernel's run may take, in minutes.
        #[arg(long, default_value_t = 20)]
        timeout_minutes: u64,
        /// Only the tests whose `module::test` contains this (repeatable), e.g.
        /// `--test trace_verdicts::route`.
        #[arg(long = "test")]
        tests: Vec<String>,
    },
    /// Runs the tests of a plan file inside a kernel-matrix VM (started by `kernel-matrix`).
    #[command(hide = true)]
    MatrixGuest { plan: std::path::PathBuf },
    /// Run every fuzz target (fuzz/, installs cargo-fuzz when missing) for N seconds each.
    Fuzz {
        /// Fuzzing time per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Only this target.
        #[arg(long)]
        target: Option<String>,
        /// Build without optimizations (quicker to build, fewer executions a second).
        #[arg(long)]
        dev: bool,
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
            rounds,
            quiet_wait,
            json,
            no_trace,
            trace_overhead_only,
            bin,
        } => {
            let opts = bench::Options {
                count,
                concurrency,
                concurrent_count,
                sandboxes,
                block,
                rounds,
                quiet_wait: std::time::Duration::from_secs(quiet_wait),
                json,
                no_trace,
                bin,
            };
            if trace_overhead_only {
                bench::run_trace_overhead(&opts)
            } else {
                bench::run(&opts)
            }
        }
        Command::BenchPool { files } => bench::run_pool(&files),
        Command::Demo => demo::run(),
        Command::Soak {
            cycles,
            callers,
            every,
            bin,
        } => soak::run(&soak::Options {
            cycles,
            callers,
            every,
            bin,
        }),
        Command::BuildRelease => release::build_dist().map(|bin| println!("{}", bin.display())),
        Command::Image => image::build().map(|archive| println!("{}", archive.display())),
        Command::Mutants {
            file,
            timeout,
            jobs,
            extra,
        } => mutants::run(&mutants::Options {
            files: file,
            timeout,
            jobs,
            extra,
        }),
        Command::KernelMatrix {
            series,
            no_host,
            time_scale,
            timeout_minutes,
            tests,
        } => matrix::run(&matrix::Options {
            series,
            host: if no_host {
                matrix::HostRuns::None
            } else {
                matrix::HostRuns::Both
            },
            time_scale,
            timeout: std::time::Duration::from_secs(timeout_minutes * 60),
            tests,
        }),
        Command::MatrixGuest { plan } => matrix::guest_main(&plan),
        Command::Fuzz {
            seconds,
            target,
            dev,
        } => fuzz::run(&fuzz::Options {
            seconds,
            target,
            dev,
        }),
    }
}
