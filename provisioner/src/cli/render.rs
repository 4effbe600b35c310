//! `provisioner render-config`: containerd conf_template -> conf file, atomically.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use provisioner::config::{RenderOutcome, parse_pod_cidrs, render_config};

#[derive(Args, Debug)]
pub struct RenderArgs {
    /// Go text/template file (containerd's conf_template syntax: .PodCIDR, .PodCIDRRanges, .Routes).
    #[arg(long)]
    template: PathBuf,
    /// The node's pod CIDR(s), comma separated (dual-stack: one per family).
    #[arg(long)]
    pod_cidr: String,
    /// Where to write the rendered config (atomically: temp file, fsync, rename).
    #[arg(long)]
    output: PathBuf,
}

pub fn run(args: &RenderArgs) -> Result<()> {
    let cidrs = parse_pod_cidrs(&args.pod_cidr).context("--pod-cidr")?;
    let outcome = render_config(&args.template, &cidrs, &args.output).with_context(|| {
        format!(
            "render {} into {}",
            args.template.display(),
            args.output.display()
        )
    })?;
    match outcome {
        RenderOutcome::Written { .. } => eprintln!("wrote {}", args.output.display()),
        RenderOutcome::Unchanged { .. } => {
            eprintln!("{} is up to date, not rewritten", args.output.display());
        }
    }
    Ok(())
}
