//! Container image archives built without a registry or a Docker daemon: one uncompressed layer
//! written as an OCI image layout tar, with a Docker `manifest.json` beside it, so that
//! `ctr images import`, `podman load` and `docker load` all accept the same file.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// What an image is called and what its config says.
pub struct Image<'a> {
    /// Full reference, e.g. `docker.io/library/provisioner:0.1.0`.
    pub name: &'a str,
    pub entrypoint: &'a [&'a str],
    pub env: &'a [&'a str],
    pub labels: &'a [(&'a str, &'a str)],
    /// The config's `User` (empty: the runtime's default, root).
    pub user: &'a str,
}

/// A file or directory of the layer.
pub enum Entry<'a> {
    Dir {
        path: &'a str,
    },
    File {
        path: &'a str,
        mode: u32,
        bytes: &'a [u8],
    },
    Symlink {
        path: &'a str,
        target: &'a str,
    },
}

/// The layer tar (uncompressed) holding `entries`, in order.
pub fn layer_tar(entries: &[Entry<'_>]) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = tar::Header::new_gnu();
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        match entry {
            Entry::Dir { path } => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o755);
                header.set_size(0);
                builder.append_data(&mut header, path, std::io::empty())
            }
            Entry::File { path, mode, bytes } => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(*mode);
                header.set_size(u64::try_from(bytes.len())?);
                builder.append_data(&mut header, path, *bytes)
            }
            Entry::Symlink { path, target } => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_mode(0o777);
                header.set_size(0);
                builder.append_link(&mut header, path, target)
            }
        }
        .with_context(|| format!("add {} to the image layer", entry.path()))?;
    }
    builder.into_inner().context("finish the image layer")
}

impl Entry<'_> {
    fn path(&self) -> &str {
        match self {
            Entry::Dir { path } | Entry::File { path, .. } | Entry::Symlink { path, .. } => path,
        }
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

fn descriptor(media_type: &str, bytes: &[u8]) -> Value {
    json!({
        "mediaType": media_type,
        "digest": format!("sha256:{}", sha256_hex(bytes)),
        "size": bytes.len(),
    })
}

/// The image config (OCI image spec) of `image` over a layer whose digest is `diff_id`.
fn config_json(image: &Image<'_>, diff_id: &str) -> Result<Vec<u8>> {
    let labels: Map<String, Value> = image
        .labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
        .collect();
    let mut config = json!({
        "Entrypoint": image.entrypoint,
        "Env": image.env,
        "Labels": labels,
    });
    if !image.user.is_empty() {
        config["User"] = Value::from(image.user);
    }
    Ok(serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{diff_id}")] },
    }))?)
}

/// The archive's bytes: the OCI image layout of `image` with `layer` (an uncompressed tar) as
/// its one layer, plus the Docker archive `manifest.json` naming the same blobs.
pub fn archive(image: &Image<'_>, layer: &[u8]) -> Result<Vec<u8>> {
    let diff_id = sha256_hex(layer);
    let config = config_json(image, &diff_id)?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar", layer)],
    }))?;
    let tag = image.name.rsplit_once(':').map_or("latest", |(_, tag)| tag);
    let mut manifest_desc = descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
    manifest_desc["annotations"] = json!({
        "io.containerd.image.name": image.name,
        "org.opencontainers.image.ref.name": tag,
    });
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [manifest_desc],
    }))?;
    let blob = |bytes: &[u8]| format!("blobs/sha256/{}", sha256_hex(bytes));
    let docker_manifest = serde_json::to_vec(&json!([{
        "Config": blob(&config),
        "RepoTags": [image.name],
        "Layers": [blob(layer)],
    }]))?;

    let mut archive = tar::Builder::new(Vec::new());
    let mut add = |name: &str, bytes: &[u8]| -> Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_size(u64::try_from(bytes.len())?);
        archive
            .append_data(&mut header, name, bytes)
            .with_context(|| format!("add {name} to the image archive"))
    };
    add(
        "oci-layout",
        br#"{"imageLayoutVersion":"1.0.0"}"#.as_slice(),
    )?;
    add("index.json", &index)?;
    add("manifest.json", &docker_manifest)?;
    for bytes in [&config[..], &manifest[..], layer] {
        add(&blob(bytes), bytes)?;
    }
    archive.into_inner().context("finish the image archive")
}

/// Writes [`archive`] to `out`.
pub fn write_archive(image: &Image<'_>, layer: &[u8], out: &Path) -> Result<()> {
    let bytes = archive(image, layer)?;
    std::fs::write(out, bytes).with_context(|| format!("write {}", out.display()))
}

/// Does this ELF64 (little-endian) file ask for a program interpreter (dynamic linking)?
pub fn has_interpreter(elf: &[u8]) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_static_from_dynamic_binaries() -> Result<()> {
        assert!(has_interpreter(&std::fs::read("/usr/sbin/ip")?));
        assert!(!has_interpreter(b"#!/bin/sh\n"));
        Ok(())
    }

    /// Both indexes of the archive name the same config and layer blobs, and each blob is
    /// stored under its digest.
    #[test]
    fn oci_index_and_docker_manifest_agree() -> Result<()> {
        let layer = layer_tar(&[Entry::Dir { path: "bin" }])?;
        let image = Image {
            name: "docker.io/library/x:1.2.3",
            entrypoint: &["/bin/x"],
            env: &[],
            labels: &[("org.opencontainers.image.version", "1.2.3")],
            user: "0",
        };
        let bytes = archive(&image, &layer)?;
        let mut files = std::collections::BTreeMap::new();
        for entry in tar::Archive::new(&bytes[..]).entries()? {
            let mut entry = entry?;
            let name = entry.path()?.display().to_string();
            let mut content = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut content)?;
            files.insert(name, content);
        }
        for (name, content) in &files {
            if let Some(digest) = name.strip_prefix("blobs/sha256/") {
                assert_eq!(digest, sha256_hex(content), "{name}");
            }
        }
        let index: Value = serde_json::from_slice(&files["index.json"])?;
        let manifest_name = format!(
            "blobs/sha256/{}",
            index["manifests"][0]["digest"]
                .as_str()
                .and_then(|d| d.strip_prefix("sha256:"))
                .context("no manifest digest")?
        );
        let manifest: Value = serde_json::from_slice(&files[&manifest_name])?;
        let docker: Value = serde_json::from_slice(&files["manifest.json"])?;
        let digest_path = |v: &Value| {
            format!(
                "blobs/sha256/{}",
                v["digest"]
                    .as_str()
                    .unwrap_or_default()
                    .trim_start_matches("sha256:")
            )
        };
        assert_eq!(docker[0]["Config"], json!(digest_path(&manifest["config"])));
        assert_eq!(
            docker[0]["Layers"][0],
            json!(digest_path(&manifest["layers"][0]))
        );
        assert_eq!(docker[0]["RepoTags"][0], "docker.io/library/x:1.2.3");
        let config: Value = serde_json::from_slice(&files[&digest_path(&manifest["config"])])?;
        assert_eq!(config["config"]["Entrypoint"], json!(["/bin/x"]));
        assert_eq!(config["config"]["User"], "0");
        assert_eq!(
            config["config"]["Labels"]["org.opencontainers.image.version"],
            "1.2.3"
        );
        Ok(())
    }
}
