//! `provisioner add|del|check` run in-process: the same code the daemon runs, without it.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};

use provisioner::config::load_conf_file;
use provisioner::dataplane::Dataplane;
use provisioner::ipam::{Allocator, OpenReport};
use provisioner::sandbox::{Network, SandboxRef, SandboxService};

use super::SandboxArgs;
use super::output;

/// Which of `provisioner add|del|check` runs (in-process here, through the daemon in
/// [`super::remote_ops`]).
#[derive(Clone, Copy, Debug)]
pub enum SandboxCommand {
    Add,
    Del,
    Check,
}

pub fn run(op: SandboxCommand, args: &SandboxArgs, config: &Path) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    runtime.block_on(run_async(op, args, config))
}

async fn run_async(op: SandboxCommand, args: &SandboxArgs, config: &Path) -> Result<()> {
    let loaded = load_conf_file(config)?;
    let network = Network::from_config(&loaded.config)?;
    let (allocator, report) = Allocator::open(&args.data_dir, &network.name, &network.ranges)
        .with_context(|| format!("open the allocation store in {}", args.data_dir.display()))?;
    warn_about(&report);
    if let Some(from) = report.migrated_from {
        tracing::info!(store = %report.path.display(), from,
            "allocation store migrated to the format that records pods");
    }
    let dataplane = Dataplane::new().context("open netlink in this network namespace")?;
    let service = SandboxService::new(network, Arc::new(allocator), dataplane);
    let sandbox = SandboxRef {
        container_id: args.container_id.clone(),
        ifname: args.ifname.clone(),
        netns: args.netns.clone(),
        pod: args.pod(),
    };
    match op {
        SandboxCommand::Add => {
            let outcome = service.add(&sandbox).await?;
            output::print_add(&outcome, args.json)
        }
        SandboxCommand::Del => {
            let outcome = service.del(&sandbox).await?;
            output::print_del(&sandbox, &outcome, args.json)
        }
        SandboxCommand::Check => {
            let allocation = service.check(&sandbox, None).await?;
            output::print_check(&allocation, args.json)
        }
    }
}

fn warn_about(report: &OpenReport) {
    for allocation in &report.out_of_range {
        tracing::warn!(
            store = %report.path.display(),
            key = %allocation.key,
            "allocation outside the configured ranges: kept reserved; delete the sandbox to release it"
        );
    }
    for (key, reason) in &report.unreadable {
        tracing::warn!(store = %report.path.display(), %key, %reason, "unreadable allocation record kept");
    }
}
