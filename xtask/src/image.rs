//! `cargo xtask image`: the container image to deploy, as an archive for `ctr images import`,
//! `podman load` and `docker load`, built without a Docker daemon. It holds the static musl
//! binary and the `/var/run` link, nothing else: the binary needs no libc, shell or
//! certificates.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};
use testkit::oci::{Entry, Image, has_interpreter, layer_tar, write_archive};

use crate::release;
use crate::step::{announce, detail, output, workspace_root};

/// The workspace version: the image's tag.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Where the binary sits in the image (deploy/provisioner.yaml runs it from there).
pub const BINARY_IN_IMAGE: &str = "usr/local/bin/provisioner";

/// The image's full reference: what the kubelet's `provisioner:VERSION` resolves to.
pub fn reference() -> String {
    format!("docker.io/library/provisioner:{VERSION}")
}

/// Where `cargo xtask image` writes the archive.
pub fn archive_path() -> PathBuf {
    workspace_root()
        .join("target")
        .join("image")
        .join(format!("provisioner-{VERSION}.oci.tar"))
}

/// Builds the static release binary, then the image archive; the archive's path.
pub fn build() -> Result<PathBuf> {
    let bin = release::build_dist()?;
    announce("image", &format!("{} from {}", reference(), bin.display()));
    let binary = std::fs::read(&bin).with_context(|| format!("read {}", bin.display()))?;
    if has_interpreter(&binary) {
        bail!(
            "{} is dynamically linked: the image holds no libc",
            bin.display()
        );
    }
    let layer = layer_tar(&[
        // Runtimes name sandbox namespaces under /var/run/netns (containerd) or /run/netns
        // (podman, ip netns): with /var/run a link to /run, one mount at /run/netns serves both.
        Entry::Dir { path: "run" },
        Entry::Dir { path: "var" },
        Entry::Symlink {
            path: "var/run",
            target: "../run",
        },
        Entry::Dir { path: "usr" },
        Entry::Dir { path: "usr/local" },
        Entry::Dir {
            path: "usr/local/bin",
        },
        Entry::File {
            path: BINARY_IN_IMAGE,
            mode: 0o755,
            bytes: &binary,
        },
    ])?;
    let revision = git(&["rev-parse", "HEAD"]).context("git rev-parse HEAD")?;
    let source = git(&["remote", "get-url", "origin"]);
    let mut labels = vec![
        ("org.opencontainers.image.title", "provisioner"),
        ("org.opencontainers.image.version", VERSION),
        ("org.opencontainers.image.revision", revision.as_str()),
    ];
    match &source {
        Some(url) => labels.push(("org.opencontainers.image.source", url.as_str())),
        None => detail("no git remote `origin`: label org.opencontainers.image.source left out"),
    }
    let entrypoint = format!("/{BINARY_IN_IMAGE}");
    let reference = reference();
    let image = Image {
        name: &reference,
        entrypoint: &[&entrypoint],
        env: &[],
        labels: &labels,
        // Root, because netlink in other namespaces and loading eBPF programs need capabilities
        // that the runtime grants a root process (deploy/provisioner.yaml keeps only those).
        user: "0",
    };
    let out = archive_path();
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    write_archive(&image, &layer, &out)?;
    detail(&format!("archive: {}", out.display()));
    Ok(out)
}

fn git(args: &[&str]) -> Option<String> {
    output(Command::new("git").current_dir(workspace_root()).args(args))
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}
