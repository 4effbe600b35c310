//! What the integration tests (tests/) and the bench and demo (xtask/) share: private network
//! namespaces removed on drop, the `provisioner daemon` process, the binary exec'd as a CNI
//! plugin the way a runtime does. Nothing here touches the root namespace's links, routes or
//! sysctls, and processes are stopped by pid only.

pub mod cni;
pub mod daemon;
pub mod netns;
pub mod oci;
pub mod soak;
pub mod tools;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

pub use netns::Netns;

/// Runs a command, failing with its stderr when it exits non-zero; its stdout. A program of
/// [`tools::ALL`] that is not installed fails naming its package.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let what = format!("{program} {}", args.join(" "));
    let out = Command::new(program).args(args).output().map_err(|err| {
        let missing = (err.kind() == std::io::ErrorKind::NotFound)
            .then(|| tools::named(program))
            .flatten();
        match missing {
            Some(tool) => anyhow::Error::new(err).context(tool.missing()),
            None => anyhow::Error::new(err).context(format!("spawn {what}")),
        }
    })?;
    stdout_of(&what, &out)
}

/// The stdout of the command `what` that gave `out`, or an error with its status and stderr.
pub fn stdout_of(what: &str, out: &Output) -> Result<String> {
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The environment variable that stretches the tests' waits and the deadlines they give the
/// product, by a factor (default 1): the kernel matrix's VMs run under software emulation,
/// several times slower than this machine.
pub const TIME_SCALE_ENV: &str = "PROVISIONER_TEST_TIME_SCALE";

/// `d` stretched by [`TIME_SCALE_ENV`].
pub fn scaled(d: Duration) -> Duration {
    let factor = std::env::var(TIME_SCALE_ENV)
        .ok()
        .and_then(|f| f.parse::<f64>().ok())
        .filter(|f| f.is_finite() && *f >= 1.0)
        .unwrap_or(1.0);
    d.mul_f64(factor)
}

/// `secs` seconds stretched by [`TIME_SCALE_ENV`], as an argument (`--trace-deadline`).
pub fn scaled_secs(secs: f64) -> String {
    format!("{:.3}", scaled(Duration::from_secs_f64(secs)).as_secs_f64())
}

/// Polls `check` until it returns a value, at most `limit` (stretched by [`scaled`]); the
/// error says what was awaited.
pub fn wait_until<T>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let limit = scaled(limit);
    let started = Instant::now();
    loop {
        if let Some(done) = check()? {
            return Ok(done);
        }
        if started.elapsed() > limit {
            bail!("gave up waiting for {what} after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Is the calling process root (namespaces, netlink and eBPF need it)?
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The `provisioner` binary of this build (`cargo xtask test` builds it before the tests), or
/// the one `PROVISIONER_BIN` names (the demo's release build).
pub fn provisioner_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("PROVISIONER_BIN") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/<test> or target/<profile>/<bin> -> target/<profile>/provisioner
    let dir = exe.parent().unwrap_or(Path::new("."));
    let profile_dir = if dir.ends_with("deps") {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    };
    let bin = profile_dir.join("provisioner");
    assert!(
        bin.is_file(),
        "{} is missing: build it with `cargo build -p provisioner` (cargo xtask test does)",
        bin.display()
    );
    bin
}
