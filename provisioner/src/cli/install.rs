//! `provisioner install` / `provisioner uninstall`: put this binary into the CNI bin dir as the
//! `provisioner` plugin (and a conf template into place), or take them away again.
//!
//! Each file is replaced atomically, since a runtime may exec the plugin at any moment: a temp
//! file in the same dir is written, fsynced, given its mode and renamed over the target. A file
//! already holding the same bytes is left alone. A binary in the way that is not a provisioner
//! binary (it lacks [`MARKER`]) is neither overwritten nor removed unless `--force` is given.

use provisioner::config::write_atomically;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;

/// Bytes every provisioner binary holds and other programs do not: how `install` tells its own
/// plugin from a foreign one without executing it. A static read through `black_box`, so that
/// the bytes stay in the binary as one piece rather than folded into compare instructions.
static MARKER: [u8; 46] = *b"provisioner-cni-plugin:6f1c2a9e-install-marker";

/// The plugin's file name in the CNI bin dir: the `type` of the network config.
const PLUGIN_NAME: &str = "provisioner";

#[derive(Args, Debug)]
pub struct InstallArgs {
    /// The CNI bin dir the runtime execs plugins from.
    #[arg(long, default_value = "/opt/cni/bin")]
    bin_dir: PathBuf,
    /// A containerd conf template to install as well (with --template-dest).
    #[arg(long, requires = "template_dest")]
    template: Option<PathBuf>,
    /// Where the template goes (containerd's `conf_template` path).
    #[arg(long, requires = "template")]
    template_dest: Option<PathBuf>,
    /// Overwrite (or, for uninstall, remove) a binary that is not a provisioner binary, and a
    /// template that differs from --template.
    #[arg(long)]
    force: bool,
}

/// What happened to one file.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Installed,
    Replaced,
    Unchanged,
    Removed,
    Absent,
}

impl Outcome {
    fn word(&self) -> &'static str {
        match self {
            Outcome::Installed => "installed",
            Outcome::Replaced => "replaced",
            Outcome::Unchanged => "unchanged",
            Outcome::Removed => "removed",
            Outcome::Absent => "absent",
        }
    }
}

/// A file `install` owns: where it goes, its content, its mode, and whether a file found there
/// may be replaced or removed.
struct Target {
    dest: PathBuf,
    content: Vec<u8>,
    mode: u32,
    /// Is `found` (the first argument) what this binary installs there, given `content`?
    ours: fn(&[u8], &[u8]) -> bool,
    /// May `install` replace a file that is not ours without --force?
    replace_any: bool,
    what: &'static str,
}

pub fn install(args: &InstallArgs) -> Result<()> {
    for target in targets(args)? {
        let outcome = install_one(&target, args.force)?;
        println!(
            "{} {} {}",
            outcome.word(),
            target.what,
            target.dest.display()
        );
    }
    Ok(())
}

pub fn uninstall(args: &InstallArgs) -> Result<()> {
    for target in targets(args)? {
        let outcome = uninstall_one(&target, args.force)?;
        println!(
            "{} {} {}",
            outcome.word(),
            target.what,
            target.dest.display()
        );
    }
    Ok(())
}

fn targets(args: &InstallArgs) -> Result<Vec<Target>> {
    let exe = Path::new("/proc/self/exe");
    let binary = fs::read(exe).context("read this binary (/proc/self/exe)")?;
    if !is_provisioner_binary(&binary) {
        bail!("/proc/self/exe holds no provisioner marker: not installing it as the plugin");
    }
    let mut targets = vec![Target {
        dest: args.bin_dir.join(PLUGIN_NAME),
        content: binary,
        mode: 0o755,
        ours: |found, _| is_provisioner_binary(found),
        replace_any: false,
        what: "plugin",
    }];
    if let (Some(src), Some(dest)) = (&args.template, &args.template_dest) {
        let content =
            fs::read(src).with_context(|| format!("read the template {}", src.display()))?;
        targets.push(Target {
            dest: dest.clone(),
            content,
            mode: 0o644,
            ours: |found, wanted| found == wanted,
            // A template that differs is an earlier version of ours: the source is the truth.
            replace_any: true,
            what: "template",
        });
    }
    Ok(targets)
}

fn is_provisioner_binary(bytes: &[u8]) -> bool {
    let marker: &[u8] = std::hint::black_box(&MARKER);
    bytes.starts_with(b"\x7fELF") && bytes.windows(marker.len()).any(|w| w == marker)
}

fn read_existing(dest: &Path) -> Result<Option<Vec<u8>>> {
    match fs::read(dest) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err).with_context(|| format!("read {}", dest.display())),
    }
}

fn install_one(target: &Target, force: bool) -> Result<Outcome> {
    let dest = &target.dest;
    let existing = read_existing(dest)?;
    let outcome = match &existing {
        None => Outcome::Installed,
        Some(found) if *found == target.content && mode_of(dest)? == target.mode => {
            return Ok(Outcome::Unchanged);
        }
        Some(found) => {
            if !target.replace_any && !(target.ours)(found, &target.content) && !force {
                bail!(
                    "{} is not a provisioner {}: not overwriting it (--force to replace it)",
                    dest.display(),
                    target.what
                );
            }
            Outcome::Replaced
        }
    };
    let dir = dest
        .parent()
        .with_context(|| format!("{}: no parent dir", dest.display()))?;
    fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    write_atomically(dest, &target.content, target.mode)
        .with_context(|| format!("write {}", dest.display()))?;
    Ok(outcome)
}

fn uninstall_one(target: &Target, force: bool) -> Result<Outcome> {
    let dest = &target.dest;
    let Some(found) = read_existing(dest)? else {
        return Ok(Outcome::Absent);
    };
    if !(target.ours)(&found, &target.content) && !force {
        bail!(
            "{} is not the provisioner {} this binary installs: not removing it (--force to \
             remove it)",
            dest.display(),
            target.what
        );
    }
    fs::remove_file(dest).with_context(|| format!("remove {}", dest.display()))?;
    Ok(Outcome::Removed)
}

fn mode_of(path: &Path) -> Result<u32> {
    let meta = fs::metadata(path).with_context(|| format!("stat {}", path.display()))?;
    Ok(meta.permissions().mode() & 0o7777)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binary_is_ours_only_with_the_marker() {
        let mut ours = b"\x7fELF....".to_vec();
        ours.extend_from_slice(&MARKER);
        ours.extend_from_slice(b"....");
        assert!(is_provisioner_binary(&ours));
        assert!(!is_provisioner_binary(b"\x7fELF plain binary"));
        assert!(
            !is_provisioner_binary(&MARKER),
            "a non-ELF file is never ours"
        );
    }

    #[test]
    fn atomic_write_sets_the_mode_and_leaves_no_temp() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("plugin");
        write_atomically(&path, b"one", 0o755)?;
        write_atomically(&path, b"two", 0o755)?;
        assert_eq!(fs::read(&path)?, b"two");
        assert_eq!(mode_of(&path)?, 0o755);
        assert_eq!(fs::read_dir(dir.path())?.count(), 1);
        Ok(())
    }
}
