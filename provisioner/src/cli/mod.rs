//! Command line: argument parsing and dispatch to one module per command.

mod daemon_cmd;
mod install;
mod local_ops;
mod log_writer;
mod output;
mod plugin;
mod remote_ops;
mod render;
mod trace_cmd;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use provisioner::daemon::api::DEFAULT_SOCKET;

/// Gives container sandboxes their network through netlink and proves, from the kernel, that
/// every sandbox really got it. Acts as a CNI plugin whenever CNI_COMMAND is set.
#[derive(Parser)]
#[command(name = "provisioner", version)]
struct Cli {
    /// Log filter (tracing env-filter syntax), e.g. `info` or `provisioner=debug`.
    #[arg(long, global = true, env = "PROVISIONER_LOG", default_value = "info")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: API on a unix socket, config watching, readiness.
    Daemon(daemon_cmd::DaemonArgs),
    /// Give a sandbox its interface, addresses and routes.
    Add(SandboxArgs),
    /// Remove a sandbox's network and release its addresses (idempotent).
    Del(SandboxArgs),
    /// Verify that the kernel holds everything a sandbox should have.
    Check(SandboxArgs),
    /// Show whether the daemon is ready, and why not.
    Status(DaemonClientArgs),
    /// List allocations.
    List(DaemonClientArgs),
    /// Every sandbox namespace the daemon's kernel watch saw: pod, verdict, creator, timeline.
    Sandboxes(SandboxesArgs),
    /// For one pod: its sandbox's verdict, timeline and the diagnosis (after `kubectl describe
    /// pod` showed "failed to find network info for sandbox").
    Why(WhyArgs),
    /// Pause (off: the eBPF programs are detached when it returns) or resume (on) the daemon's
    /// kernel watch; a resumed watch audits the live sandboxes, as at start.
    KernelWatch(KernelWatchArgs),
    /// Trace sandbox network setup in the kernel, live, without the daemon.
    Trace(trace_cmd::TraceArgs),
    /// Render a containerd-style CNI conf template from the node's pod CIDRs.
    RenderConfig(render::RenderArgs),
    /// Copy this binary into the CNI bin dir as the `provisioner` plugin (and a conf template
    /// into place), atomically; files already up to date are left alone.
    Install(install::InstallArgs),
    /// Remove what `install` put in place, if it is still ours.
    Uninstall(install::InstallArgs),
}

/// Which sandbox, and whom to ask.
#[derive(Args, Clone, Debug)]
pub struct SandboxArgs {
    /// Container (sandbox) id, as CNI_CONTAINERID.
    #[arg(long)]
    container_id: String,
    /// Path of the sandbox network namespace, as CNI_NETNS (optional for del).
    #[arg(long)]
    netns: Option<PathBuf>,
    /// Interface name inside the sandbox.
    #[arg(long, default_value = "eth0")]
    ifname: String,
    /// Run in-process with this network config file instead of asking the daemon.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Allocation store for the in-process mode (--config).
    #[arg(long, default_value = "/var/lib/provisioner")]
    data_dir: PathBuf,
    /// The daemon's socket.
    #[arg(long, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Print JSON (CNI result shape for add).
    #[arg(long)]
    json: bool,
    /// The pod the sandbox belongs to, as a runtime passes it in CNI_ARGS
    /// (`K8S_POD_NAMESPACE=ns;K8S_POD_NAME=name;K8S_POD_UID=uid;K8S_POD_INFRA_CONTAINER_ID=id`).
    #[arg(long, value_name = "CNI_ARGS")]
    cni_args: Option<String>,
}

impl SandboxArgs {
    /// The pod `--cni-args` names.
    fn pod(&self) -> Option<provisioner::pod::Pod> {
        self.cni_args
            .as_deref()
            .and_then(provisioner::pod::Pod::from_cni_args)
    }
}

#[derive(Args, Clone, Debug)]
pub struct DaemonClientArgs {
    /// The daemon's socket.
    #[arg(long, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    #[arg(long)]
    json: bool,
}

#[derive(Args, Clone, Debug)]
pub struct SandboxesArgs {
    /// Only the sandboxes of this pod: NAMESPACE/NAME (or a bare NAME).
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pod: Option<String>,
    /// Only the sandboxes whose latest verdict is this one.
    #[arg(long, value_parser = verdict_names())]
    verdict: Option<String>,
    #[command(flatten)]
    daemon: DaemonClientArgs,
}

fn verdict_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(
        provisioner::trace::Verdict::ALL.map(provisioner::trace::Verdict::as_str),
    )
}

#[derive(Args, Clone, Debug)]
pub struct WhyArgs {
    /// The pod: NAMESPACE/NAME (or a bare NAME), as `kubectl get pods -A` shows it.
    #[arg(value_name = "NAMESPACE/NAME")]
    pod: String,
    #[command(flatten)]
    daemon: DaemonClientArgs,
}

#[derive(Args, Clone, Debug)]
pub struct KernelWatchArgs {
    #[arg(value_enum)]
    state: remote_ops::Switch,
    #[command(flatten)]
    daemon: DaemonClientArgs,
}

pub fn main() -> ExitCode {
    if std::env::var_os("CNI_COMMAND").is_some() {
        return plugin::main();
    }
    let cli = Cli::parse();
    let log_format = match &cli.command {
        Command::Daemon(args) => args.log_format,
        Command::Trace(args) => args.log_format,
        _ => LogFormat::Text,
    };
    init_logging(&cli.log, log_format);
    let result = match cli.command {
        Command::Daemon(args) => daemon_cmd::run(args),
        Command::Add(args) => sandbox_op(local_ops::SandboxCommand::Add, &args),
        Command::Del(args) => sandbox_op(local_ops::SandboxCommand::Del, &args),
        Command::Check(args) => sandbox_op(local_ops::SandboxCommand::Check, &args),
        Command::Status(args) => match remote_ops::status(&args.socket, args.json) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(3),
            Err(err) => Err(err),
        },
        Command::List(args) => remote_ops::list(&args.socket, args.json),
        Command::Sandboxes(args) => remote_ops::sandboxes(
            &args.daemon.socket,
            args.daemon.json,
            args.pod,
            args.verdict,
        ),
        Command::Why(args) => {
            match remote_ops::why(&args.daemon.socket, &args.pod, args.daemon.json) {
                Ok(true) => Ok(()),
                Ok(false) => return ExitCode::from(2),
                Err(err) => Err(err),
            }
        }
        Command::KernelWatch(args) => {
            remote_ops::kernel_watch(&args.daemon.socket, args.state, args.daemon.json)
        }
        Command::Trace(args) => trace_cmd::run(args),
        Command::RenderConfig(args) => render::run(&args),
        Command::Install(args) => install::install(&args),
        Command::Uninstall(args) => install::uninstall(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("provisioner: error: {}", error_text(&err));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each said once: our errors' messages already name their cause
/// (CNI messages and log lines print one message, and must be complete), so a cause whose text
/// its parent's message already holds is not repeated.
/// The backends `choices` (`observation=backend` each) name; the error names `flag`.
fn backend_choices(
    choices: &[String],
    flag: &str,
) -> anyhow::Result<provisioner::trace::BackendChoices> {
    let mut chosen = provisioner::trace::BackendChoices::default();
    for choice in choices {
        chosen
            .choose(choice)
            .map_err(|err| anyhow::anyhow!("{flag} {err}"))?;
    }
    Ok(chosen)
}

fn error_text(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let said = cause.to_string();
        if text.contains(&said) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&said);
    }
    text
}

fn sandbox_op(op: local_ops::SandboxCommand, args: &SandboxArgs) -> anyhow::Result<()> {
    match &args.config {
        Some(config) => local_ops::run(op, args, config),
        None => remote_ops::sandbox(op, args),
    }
}

/// How log lines are written to stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the event's
    /// fields as keys.
    Json,
}

fn init_logging(filter: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text if colored_log() => {
            builder.with_ansi(true).with_writer(std::io::stderr).init()
        }
        LogFormat::Text => builder
            .with_ansi(false)
            .with_writer(log_writer::LineSafeStderr)
            .init(),
        LogFormat::Json => builder
            .with_writer(std::io::stderr)
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
}

/// Colours only on a terminal, and not with `NO_COLOR` set: a log read from journald or a file
/// must not carry escape codes.
fn colored_log() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use provisioner::daemon::client::ClientError;

    use super::error_text;

    #[test]
    fn each_cause_is_said_once() {
        let unreachable = ClientError::Unreachable {
            socket: PathBuf::from("/run/provisioner/provisioner.sock"),
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
        };
        let err = anyhow::Error::new(unreachable).context("provisioner status");
        assert_eq!(
            error_text(&err),
            "provisioner status: daemon unreachable at /run/provisioner/provisioner.sock: \
             No such file or directory (os error 2)"
        );
    }

    #[test]
    fn causes_a_message_does_not_hold_are_kept() {
        let io = std::io::Error::from_raw_os_error(libc::EACCES);
        let err = anyhow::Error::new(io).context("open /var/lib/provisioner");
        assert_eq!(
            error_text(&err),
            "open /var/lib/provisioner: Permission denied (os error 13)"
        );
    }
}
