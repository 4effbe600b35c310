//! Booting a kernel under qemu with the host's userland (virtme-ng): the guest sees the host's
//! files read-only (with writable overlays on /etc, /tmp, /home...), so it runs the binaries
//! this workspace built. KVM does not work on these machines: the guests run under software
//! emulation (TCG), with one vCPU each (two vCPUs under TCG stalled the 5.10 guest while
//! tracepoints were patched in).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::kernels::GuestKernel;
use crate::bootstrap::tools_dir;
use crate::step::{announce, detail, output, run};

/// virtme-ng release the matrix boots kernels with.
const VIRTME_NG_VERSION: &str = "1.42";
/// Memory of a guest.
const GUEST_MEMORY: &str = "2G";

/// Installs what booting a guest needs: qemu and kmod (Debian), virtme-ng (PyPI, in a venv of
/// the tools directory); the `vng` to run.
pub fn bootstrap() -> Result<PathBuf> {
    crate::bootstrap::apt_install(
        "qemu and kmod for the kernel VMs",
        &[
            ("qemu-system-x86", "/usr/bin/qemu-system-x86_64"),
            ("kmod", "/usr/sbin/depmod"),
        ],
    )?;
    announce(
        "bootstrap",
        &format!("virtme-ng {VIRTME_NG_VERSION} (PyPI)"),
    );
    let venv = tools_dir().join("virtme-ng");
    let vng = venv.join("bin/vng");
    if output(Command::new(&vng).arg("--version")).is_some_and(|v| v.contains(VIRTME_NG_VERSION)) {
        detail(&format!("present in {}, skipping", venv.display()));
        return Ok(vng);
    }
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    run(Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet"])
        .arg(format!("virtme-ng=={VIRTME_NG_VERSION}")))?;
    Ok(vng)
}

/// A guest booted with a command to run; killed when dropped.
pub struct Guest {
    child: Child,
    pub started: Instant,
}

impl Guest {
    /// Boots `kernel` and runs `command` in it; the console (kernel messages and the
    /// command's output) goes to `console`. `rw_dir` is writable in the guest (its results).
    pub fn boot(
        vng: &Path,
        kernel: &GuestKernel,
        command: &[String],
        rw_dir: &Path,
        console: &Path,
    ) -> Result<Self> {
        let log = std::fs::File::create(console)
            .with_context(|| format!("create {}", console.display()))?;
        // At the lowest priority: the guests share the machine with the host's suite, whose
        // one-second deadlines must not wait for them (theirs are stretched).
        let mut cmd = Command::new("nice");
        cmd.args(["-n", "19"])
            .arg(vng)
            .args(["--disable-kvm", "--verbose", "--cpus", "1", "--memory"])
            .arg(GUEST_MEMORY)
            // The kernel's check that the IO-APIC timer ticks fails when an emulated guest is
            // starved by a busy host, and the kernel then panics at boot.
            .args(["--append", "no_timer_check"])
            .arg("--run")
            .arg(&kernel.vmlinuz)
            .arg("--rwdir")
            .arg(rw_dir)
            .arg("--")
            .args(command)
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    vng.parent()
                        .map(|d| d.display().to_string())
                        .unwrap_or_default(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // A process group of its own: qemu and its helpers end together.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd.spawn().context("spawn vng")?;
        Ok(Self {
            child,
            started: Instant::now(),
        })
    }

    /// Whether the guest has powered off; its exit code tells nothing (vng's is not the
    /// command's): the results are read from what the command wrote.
    pub fn finished(&mut self) -> Result<bool> {
        Ok(self.child.try_wait()?.is_some())
    }

    /// Ends the guest (a timeout).
    pub fn kill(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill has no memory preconditions; the group is the guest's own.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = self.child.wait();
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}

/// Waits until every guest has powered off, each at most `limit` (a guest past it is killed
/// and its kernel reported as timed out), printing progress.
pub fn wait_all(guests: &mut [(String, &mut Guest)], limit: Duration) -> Result<Vec<String>> {
    let mut timed_out = Vec::new();
    let mut last_note = Instant::now();
    loop {
        let mut running = Vec::new();
        for (name, guest) in guests.iter_mut() {
            if guest.finished()? {
                continue;
            }
            if guest.started.elapsed() > limit {
                guest.kill();
                timed_out.push(name.clone());
                continue;
            }
            running.push(format!("{name} {}s", guest.started.elapsed().as_secs()));
        }
        if running.is_empty() {
            return Ok(timed_out);
        }
        if last_note.elapsed() > Duration::from_secs(60) {
            detail(&format!("still running: {}", running.join(", ")));
            last_note = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Fails with the tail of `console` when it shows the guest never ran its command.
pub fn check_booted(console: &Path, marker: &str) -> Result<()> {
    let text = std::fs::read_to_string(console).unwrap_or_default();
    if text.contains(marker) {
        return Ok(());
    }
    let tail: Vec<&str> = text.lines().rev().take(30).collect();
    bail!(
        "the guest never ran its command (no {marker:?} on its console {}); its last lines:\n{}",
        console.display(),
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    )
}
