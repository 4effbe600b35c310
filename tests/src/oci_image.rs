//! The tests' container image: one layer holding the static busybox (`busybox-static`) and a
//! link per applet the tests use, as an archive `ctr images import` and `podman load` accept
//! (built by [`testkit::oci`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use testkit::oci::{Entry, Image, has_interpreter, layer_tar, write_archive};

/// Where Debian's `busybox-static` installs the binary.
pub const BUSYBOX: &str = testkit::tools::BUSYBOX.path;

/// Applets linked under /bin: what a pause process and the tests' containers run.
const APPLETS: &[&str] = &["sh", "sleep", "ip", "grep", "cat", "echo", "true"];

/// An image: its reference name and entrypoint.
pub struct ImageSpec<'a> {
    /// e.g. `localhost/pause:latest`.
    pub name: &'a str,
    pub entrypoint: &'a [&'a str],
}

/// The usual stand-in for the pause image: `/bin/sleep infinity`.
pub const PAUSE: ImageSpec<'static> = ImageSpec {
    name: "localhost/pause:latest",
    entrypoint: &["/bin/sleep", "infinity"],
};

/// A busybox image whose containers are given their command by the test.
pub const BUSYBOX_IMAGE: ImageSpec<'static> = ImageSpec {
    name: "localhost/busybox:latest",
    entrypoint: &[],
};

/// The uncompressed root filesystem tar: /bin/busybox plus one symlink per applet.
pub fn rootfs_tar() -> Result<Vec<u8>> {
    testkit::tools::BUSYBOX.require()?;
    let binary = std::fs::read(BUSYBOX).with_context(|| format!("read {BUSYBOX}"))?;
    if has_interpreter(&binary) {
        bail!(
            "{BUSYBOX} is dynamically linked (Debian's `busybox`): an image needs busybox-static"
        );
    }
    let links: Vec<String> = APPLETS.iter().map(|a| format!("bin/{a}")).collect();
    let mut entries: Vec<Entry<'_>> = ["bin", "etc", "proc", "sys", "dev", "tmp"]
        .into_iter()
        .map(|path| Entry::Dir { path })
        .collect();
    entries.push(Entry::File {
        path: "bin/busybox",
        mode: 0o755,
        bytes: &binary,
    });
    entries.extend(links.iter().map(|path| Entry::Symlink {
        path,
        target: "busybox",
    }));
    layer_tar(&entries)
}

/// Writes the OCI image archive of `spec` at `out` (for `ctr image import`).
pub fn write_oci_archive(spec: &ImageSpec<'_>, out: &Path) -> Result<()> {
    let image = Image {
        name: spec.name,
        entrypoint: spec.entrypoint,
        env: &["PATH=/bin"],
        labels: &[],
        user: "",
    };
    write_archive(&image, &rootfs_tar()?, out)
}

/// Writes the root filesystem tar (for `podman import`) into `dir` and returns its path.
pub fn write_rootfs_tar(dir: &Path) -> Result<PathBuf> {
    let path = dir.join("rootfs.tar");
    std::fs::write(&path, rootfs_tar()?).with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busybox_static_is_static() -> Result<()> {
        assert!(!has_interpreter(&std::fs::read(BUSYBOX)?));
        Ok(())
    }
}
