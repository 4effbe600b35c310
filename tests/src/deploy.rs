//! The Kubernetes manifests in `deploy/`, read as typed objects.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::ConfigMap;
use serde::Deserialize;

/// The one manifest file: a ConfigMap with the CNI conf template and the DaemonSet.
pub fn manifest_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/provisioner.yaml")
}

/// The example scrape job for a Prometheus without the Operator.
pub fn scrape_config_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring/scrape-config.yaml")
}

/// The Prometheus Operator's PodMonitor for the DaemonSet's pods.
pub fn pod_monitor_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring/podmonitor.yaml")
}

/// The manifests, in file order.
#[derive(Debug, Default)]
pub struct Manifests {
    pub config_maps: Vec<ConfigMap>,
    pub daemon_sets: Vec<DaemonSet>,
}

#[derive(Deserialize)]
struct TypeMeta {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
}

/// Parses every document of the manifest file into its typed Kubernetes object; an unknown
/// kind, a misspelt field or a wrong type is an error naming the document.
pub fn load() -> Result<Manifests> {
    let path = manifest_path();
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let mut manifests = Manifests::default();
    for (i, document) in serde_norway::Deserializer::from_str(&text).enumerate() {
        let value = serde_norway::Value::deserialize(document)
            .with_context(|| format!("{} document {i}: not YAML", path.display()))?;
        if value.is_null() {
            continue;
        }
        let meta: TypeMeta = serde_norway::from_value(value.clone())
            .with_context(|| format!("{} document {i}: no apiVersion/kind", path.display()))?;
        let what = format!(
            "{} document {i} ({} {})",
            path.display(),
            meta.api_version,
            meta.kind
        );
        match (meta.api_version.as_str(), meta.kind.as_str()) {
            ("v1", "ConfigMap") => manifests
                .config_maps
                .push(strict(&value).with_context(|| what.clone())?),
            ("apps/v1", "DaemonSet") => manifests
                .daemon_sets
                .push(strict(&value).with_context(|| what.clone())?),
            _ => bail!("{what}: unexpected kind"),
        }
    }
    Ok(manifests)
}

/// Deserializes `value` as `T` and checks that nothing was dropped on the way: k8s-openapi
/// ignores unknown fields, so a misspelt one would otherwise pass unnoticed.
fn strict<T>(value: &serde_norway::Value) -> Result<T>
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    let typed: T = serde_norway::from_value(value.clone())?;
    let back = serde_json::to_value(&typed)?;
    let original = serde_json::to_value(value)?;
    if let Some(field) = first_dropped(&original, &back, "") {
        bail!("field {field} is not part of the typed object (misspelt or misplaced?)");
    }
    Ok(typed)
}

/// The first path present in `original` and missing in `typed`.
fn first_dropped(
    original: &serde_json::Value,
    typed: &serde_json::Value,
    at: &str,
) -> Option<String> {
    match (original, typed) {
        (serde_json::Value::Object(o), serde_json::Value::Object(t)) => {
            o.iter().find_map(|(k, v)| {
                let here = format!("{at}.{k}");
                match t.get(k) {
                    None => Some(here),
                    Some(tv) => first_dropped(v, tv, &here),
                }
            })
        }
        (serde_json::Value::Array(o), serde_json::Value::Array(t)) => o
            .iter()
            .zip(t)
            .enumerate()
            .find_map(|(i, (ov, tv))| first_dropped(ov, tv, &format!("{at}[{i}]"))),
        _ => None,
    }
}

/// The containerd CNI conf template held by the ConfigMap.
pub fn cni_template() -> Result<String> {
    load()?
        .config_maps
        .iter()
        .find_map(|cm| cm.data.as_ref()?.get("cni.template").cloned())
        .context("no ConfigMap in deploy/ holds cni.template")
}

/// The image archive `cargo xtask image` builds (`cargo xtask test` builds it first and names it
/// in `PROVISIONER_IMAGE`).
pub fn image_archive() -> Result<PathBuf> {
    let path = std::env::var_os("PROVISIONER_IMAGE").map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!(
                "../target/image/provisioner-{}.oci.tar",
                env!("CARGO_PKG_VERSION")
            ))
        },
        PathBuf::from,
    );
    if !path.exists() {
        bail!(
            "no image archive at {}: build it with `cargo xtask image`",
            path.display()
        );
    }
    Ok(path)
}

/// The image reference the manifests run, as containerd and podman name it once loaded.
pub fn image_reference() -> String {
    format!(
        "docker.io/library/provisioner:{}",
        env!("CARGO_PKG_VERSION")
    )
}

/// An HTTP GET from inside `node`, as the kubelet runs an httpGet probe of a host-network pod:
/// the status code, or None when nothing listens at `addr`.
pub fn probe_status(node: &crate::Netns, addr: &str, path: &str) -> Result<Option<u16>> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    crate::in_netns(node.path(), || -> Result<Option<u16>> {
        let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
            return Ok(None);
        };
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(request.as_bytes())?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        let code = response
            .split_whitespace()
            .nth(1)
            .with_context(|| format!("GET {addr}{path}: no HTTP status line in {response:?}"))?;
        Ok(Some(code.parse()?))
    })?
}
