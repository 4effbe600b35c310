use std::path::PathBuf;

/// Why kernel tracing could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("read kernel BTF {path}: {source}")]
    ReadBtf {
        path: PathBuf,
        source: btf_rs::Error,
    },
    #[error("kernel BTF has no member {path} (needed by the tracer): {reason}")]
    MissingMember { path: String, reason: String },
    #[error("mount {fs} at {target}: {source}")]
    Mount {
        fs: &'static str,
        target: PathBuf,
        source: nix::Error,
    },
    #[error("load eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("eBPF program {program}: {action}: {source}")]
    Program {
        program: &'static str,
        action: &'static str,
        source: aya::programs::ProgramError,
    },
    #[error("eBPF map {map}: {reason}")]
    Map { map: &'static str, reason: String },
    #[error("kernel BTF for program attach: {0}")]
    AttachBtf(#[from] aya::BtfError),
    #[error("register ring buffer with the runtime: {0}")]
    Poll(std::io::Error),
    #[error("network namespace {path}: {source}")]
    Netns {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("write trace output: {0}")]
    Output(std::io::Error),
    #[error("the task loading the eBPF programs failed: {0}")]
    Worker(String),
}
