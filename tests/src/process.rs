//! What a runtime test starts and must take down: processes started in a network namespace,
//! stopped by pid, found by an argument only they carry (never by name: other agents on the
//! machine run the same programs); mounts left under the test's own dir.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Spawns `cmd` in the network namespace at `netns` (and only that namespace: the mount
/// namespace stays the caller's, so namespace pins under /run/netns stay visible to everyone).
pub fn spawn_in_netns(cmd: &mut Command, netns: &Path) -> Result<Child> {
    let file = File::open(netns).with_context(|| format!("open netns {}", netns.display()))?;
    let fd = file.as_raw_fd();
    // SAFETY: the closure runs between fork and exec and only calls setns(2), which is
    // async-signal-safe; `file` stays open until the spawn returned.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("spawn {cmd:?} in netns {}", netns.display()))?;
    drop(file);
    Ok(child)
}

/// SIGTERM to `child` by pid, SIGKILL if it has not exited within `limit`; reaps it.
pub fn stop_pid(child: &mut Child, limit: Duration) -> Result<()> {
    let pid = Pid::from_raw(i32::try_from(child.id())?);
    let _ = kill(pid, Signal::SIGTERM);
    let started = Instant::now();
    while started.elapsed() < limit {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = kill(pid, Signal::SIGKILL);
    child.wait()?;
    Ok(())
}

/// Processes that have `arg` as one whole argument on their command line (e.g. the socket path
/// of one containerd instance, which its shims carry too).
pub fn pids_with_arg(arg: &OsStr) -> Vec<Pid> {
    let needle = arg.as_encoded_bytes();
    pids_where(|a| a == needle)
}

/// Processes with an argument for which `matches` holds.
pub fn pids_where(matches: impl Fn(&[u8]) -> bool) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| cmdline.split(|b| *b == 0).any(&matches))
        })
        .map(Pid::from_raw)
        .collect()
}

/// Lazily unmounts every mount point under `dir` (rootfs and shm mounts left by a crash).
pub fn unmount_under(dir: &Path) {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in points {
        let _ = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH);
    }
}
