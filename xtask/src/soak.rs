//! `cargo xtask soak`: ADD+DEL cycles against the release daemon with tracing on, 16 callers,
//! a sample per window of cycles (resident memory, open fds, threads, store file size, the
//! node's link count, ADD latency), and whether the end stayed within bounds of the start
//! (testkit's soak does the work; the soak test runs a short one).

use std::path::PathBuf;

use anyhow::{Result, bail};
use testkit::soak::{self, Bounds, Sample};

use crate::release;

pub struct Options {
    pub cycles: usize,
    pub callers: usize,
    pub every: usize,
    /// Soak this provisioner binary instead of building one.
    pub bin: Option<PathBuf>,
}

pub fn run(opts: &Options) -> Result<()> {
    testkit::netns::require_root();
    let bin = match &opts.bin {
        Some(bin) => bin.clone(),
        None => release::build_release()?,
    };
    let dir = tempfile::tempdir()?;
    println!(
        "soak: {} ADD+DEL cycles, {} callers, tracing on, {}",
        opts.cycles,
        opts.callers,
        bin.display()
    );
    println!("{}", Sample::header());
    let samples = soak::run(
        &bin,
        dir.path(),
        &soak::Options {
            cycles: opts.cycles,
            callers: opts.callers,
            every: opts.every,
        },
        |s| println!("{}", s.row()),
    )?;
    let violations = soak::violations(&samples, &Bounds::default());
    if violations.is_empty() {
        println!("soak held: the end is within bounds of the start (after the first window)");
        return Ok(());
    }
    for v in &violations {
        println!("out of bounds: {v}");
    }
    bail!("soak: {} bound(s) exceeded", violations.len())
}
