use std::path::PathBuf;

/// Why kernel tracing could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(
        "this kernel has no readable BTF ({path}: {source}); the kernel watch needs \
         CONFIG_DEBUG_INFO_BTF"
    )]
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
    #[error(
        "this kernel has no BPF ring buffer (Linux 5.8), which the kernel watch sends its \
         records through: creating it failed: {0}"
    )]
    NoRingBuffer(String),
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
    #[error(
        "the embedded eBPF object has event layout {object}, this binary decodes layout \
         {expected}: rebuild the object with `cargo xtask build-ebpf`, then provisioner"
    )]
    AbiMismatch { object: String, expected: String },
    #[error(
        "the tracer reads x86_64 syscall numbers and registers (pt_regs); this is {0} (the \
         daemon runs without tracing with --no-trace)"
    )]
    UnsupportedArch(&'static str),
}

impl TraceError {
    /// The error of loading the object: a ring buffer the kernel cannot create says so.
    pub(crate) fn from_load(err: aya::EbpfError) -> Self {
        match &err {
            aya::EbpfError::MapError(aya::maps::MapError::CreateError { name, io_error })
                if name == "EVENTS" =>
            {
                Self::NoRingBuffer(io_error.to_string())
            }
            _ => Self::Load(err),
        }
    }
}
