//! A container image built without a registry: one gzip layer holding the static busybox
//! (`busybox-static`) and a link per applet the tests use, written as an OCI image layout tar
//! that `ctr image import` and `podman load` accept.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Where Debian's `busybox-static` installs the binary.
pub const BUSYBOX: &str = "/bin/busybox";

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

fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// The uncompressed root filesystem tar: /bin/busybox plus one symlink per applet.
pub fn rootfs_tar() -> Result<Vec<u8>> {
    let busybox = Path::new(BUSYBOX);
    let binary = std::fs::read(busybox).with_context(|| {
        format!("{BUSYBOX} is missing: install busybox-static (cargo xtask test bootstraps it)")
    })?;
    if has_interpreter(&binary) {
        bail!(
            "{BUSYBOX} is dynamically linked (Debian's `busybox`): an image needs busybox-static"
        );
    }
    let mut builder = tar::Builder::new(Vec::new());
    for dir in ["bin", "etc", "proc", "sys", "dev", "tmp"] {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o755);
        header.set_size(0);
        builder
            .append_data(&mut header, dir, std::io::empty())
            .with_context(|| format!("add /{dir} to the image layer"))?;
    }
    builder
        .append_path_with_name(busybox, "bin/busybox")
        .with_context(|| format!("add {BUSYBOX} to the image layer"))?;
    for applet in APPLETS {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_mode(0o777);
        header.set_size(0);
        builder
            .append_link(&mut header, format!("bin/{applet}"), "busybox")
            .with_context(|| format!("add /bin/{applet} to the image layer"))?;
    }
    builder.into_inner().context("finish the image layer")
}

/// Writes the OCI image layout of `spec` as a tar at `out` (for `ctr image import`).
pub fn write_oci_archive(spec: &ImageSpec<'_>, out: &Path) -> Result<()> {
    let layer = rootfs_tar()?;
    let diff_id = sha256_hex(&layer);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&layer)?;
    let layer_gz = gz.finish().context("gzip the image layer")?;

    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": spec.entrypoint,
            "Env": ["PATH=/bin"],
        },
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{diff_id}")] },
    }))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar+gzip", &layer_gz)],
    }))?;
    let mut manifest_desc = descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
    manifest_desc["annotations"] = json!({
        "io.containerd.image.name": spec.name,
        "org.opencontainers.image.ref.name": spec.name.rsplit(':').next().unwrap_or("latest"),
    });
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [manifest_desc],
    }))?;

    let mut archive = tar::Builder::new(Vec::new());
    let mut add = |name: String, bytes: &[u8]| -> Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(u64::try_from(bytes.len())?);
        archive
            .append_data(&mut header, &name, bytes)
            .with_context(|| format!("add {name} to the image archive"))
    };
    add(
        "oci-layout".into(),
        br#"{"imageLayoutVersion":"1.0.0"}"#.as_slice(),
    )?;
    add("index.json".into(), &index)?;
    for blob in [&config, &manifest, &layer_gz] {
        add(format!("blobs/sha256/{}", sha256_hex(blob)), blob)?;
    }
    let bytes = archive.into_inner().context("finish the image archive")?;
    std::fs::write(out, bytes).with_context(|| format!("write {}", out.display()))
}

/// Does this ELF64 (little-endian) file ask for a program interpreter (dynamic linking)?
fn has_interpreter(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
    };
    if !elf.starts_with(b"\x7fELF") {
        return false;
    }
    let (Some(phoff), Some(entsize), Some(count)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    let Ok(phoff) = usize::try_from(phoff) else {
        return false;
    };
    (0..usize::from(count)).any(|i| {
        let at = phoff + i * usize::from(entsize);
        elf.get(at..at + 4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_le_bytes)
            == Some(PT_INTERP)
    })
}

fn descriptor(media_type: &str, bytes: &[u8]) -> Value {
    json!({
        "mediaType": media_type,
        "digest": format!("sha256:{}", sha256_hex(bytes)),
        "size": bytes.len(),
    })
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
    fn tells_static_from_dynamic_binaries() -> Result<()> {
        assert!(has_interpreter(&std::fs::read("/usr/sbin/ip")?));
        assert!(!has_interpreter(&std::fs::read(BUSYBOX)?));
        assert!(!has_interpreter(b"#!/bin/sh\n"));
        Ok(())
    }
}
