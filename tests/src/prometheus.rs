//! A real Prometheus (Debian's `prometheus`) run inside a test's network namespace, and plain
//! HTTP GETs from inside one.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use crate::{Netns, wait_until};

/// The port of Prometheus' API, on the loopback of its namespace.
pub const PROMETHEUS_PORT: u16 = 9090;
/// Bound on Prometheus becoming ready (a loaded machine).
const READY_LIMIT: Duration = Duration::from_secs(40);

/// `GET path` on a loopback port inside `netns`; the status code and the body.
pub fn http_get(netns: &Netns, port: u16, path: &str) -> Result<(u16, String)> {
    http_get_at(netns, &format!("127.0.0.1:{port}"), path)
}

/// `GET path` on `addr` (`IP:PORT`) from inside `netns`; the status code and the body.
pub fn http_get_at(netns: &Netns, addr: &str, path: &str) -> Result<(u16, String)> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| -> Result<(u16, String)> {
                netns.enter_thread()?;
                let mut stream = std::net::TcpStream::connect(addr)
                    .with_context(|| format!("connect to {addr} in {}", netns.name()))?;
                stream.set_read_timeout(Some(Duration::from_secs(10)))?;
                stream.write_all(
                    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                )?;
                let mut response = Vec::new();
                stream.read_to_end(&mut response)?;
                let response = String::from_utf8_lossy(&response);
                let (head, body) = response
                    .split_once("\r\n\r\n")
                    .with_context(|| format!("no HTTP body for {path}: {response}"))?;
                let status = head
                    .split_whitespace()
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .with_context(|| format!("no HTTP status for {path}: {head}"))?;
                let body = if head
                    .to_ascii_lowercase()
                    .contains("transfer-encoding: chunked")
                {
                    dechunk(body)
                } else {
                    body.to_owned()
                };
                Ok((status, body))
            })
            .join()
            .map_err(|_| anyhow::anyhow!("HTTP thread for {path} panicked"))?
    })
}

/// The body of a chunked HTTP/1.1 response.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server inside a netns, killed (by pid) and its directory removed on drop.
pub struct Prometheus<'n> {
    child: Child,
    netns: &'n Netns,
    dir: tempfile::TempDir,
}

impl Drop for Prometheus<'_> {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl<'n> Prometheus<'n> {
    /// Starts Prometheus in `netns` with the configuration `config` (YAML; relative paths in it
    /// are read from a directory of its own), its API on the namespace's loopback, and waits
    /// until it is ready.
    pub fn start(netns: &'n Netns, config: &str) -> Result<Self> {
        Self::start_with_files(netns, config, &[])
    }

    /// [`Prometheus::start`], with `files` (name, content) written to its directory first: the
    /// rule files and target files its configuration names by a relative path.
    pub fn start_with_files(
        netns: &'n Netns,
        config: &str,
        files: &[(&str, &str)],
    ) -> Result<Self> {
        let prometheus = testkit::tools::PROMETHEUS.require()?;
        let dir = tempfile::tempdir()?;
        for (name, content) in files {
            std::fs::write(dir.path().join(name), content)?;
        }
        let config_file = dir.path().join("prometheus.yml");
        std::fs::write(&config_file, config)?;
        let log = std::fs::File::create(dir.path().join("prometheus.log"))?;
        let mut cmd = Command::new(prometheus);
        cmd.arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}"))
            .arg("--log.level=warn")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        netns.enter(&mut cmd)?;
        let child = cmd.spawn().context("start prometheus")?;
        let prometheus = Self { child, netns, dir };
        wait_until("prometheus ready", READY_LIMIT, || {
            Ok(matches!(prometheus.get("/-/ready"), Ok((200, _))).then_some(()))
        })
        .with_context(|| prometheus.log())?;
        Ok(prometheus)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    pub fn get(&self, path: &str) -> Result<(u16, String)> {
        http_get(self.netns, PROMETHEUS_PORT, path)
    }

    /// The `data` of a successful API answer.
    pub fn api(&self, path: &str) -> Result<Value> {
        let (status, body) = self.get(path)?;
        let answer: Value =
            serde_json::from_str(&body).with_context(|| format!("{path}: {status} {body}"))?;
        ensure!(
            status == 200 && answer["status"] == "success",
            "{path}: {status} {body}"
        );
        Ok(answer["data"].clone())
    }

    /// The instant vector (or scalar) `expr` evaluates to now; an error if it does not parse.
    pub fn query(&self, expr: &str) -> Result<Vec<Value>> {
        let data = self
            .api(&format!("/api/v1/query?query={}", url_encode(expr)))
            .with_context(|| format!("query {expr}"))?;
        Ok(match data["resultType"].as_str() {
            Some("vector" | "matrix") => data["result"].as_array().cloned().unwrap_or_default(),
            _ => vec![data["result"].clone()],
        })
    }

    pub fn firing(&self, alertname: &str) -> Result<Vec<Value>> {
        self.alerts(alertname, "firing")
    }

    /// The alerts of rule `alertname` in `state` (`pending`, `firing`).
    pub fn alerts(&self, alertname: &str, state: &str) -> Result<Vec<Value>> {
        let data = self.api("/api/v1/alerts")?;
        Ok(data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| a["labels"]["alertname"] == alertname && a["state"] == state)
            .cloned()
            .collect())
    }

    /// Waits (up to `patience`) until rule `alertname`, one with a `for:`, fires, having seen it
    /// pending first: its `for:` held it back.
    pub fn wait_pending_then_firing(&self, alertname: &str, patience: Duration) -> Result<()> {
        let mut pending = false;
        wait_until(
            &format!("{alertname} pending, then firing"),
            patience,
            || {
                pending |= !self.alerts(alertname, "pending")?.is_empty();
                Ok((!self.firing(alertname)?.is_empty()).then_some(()))
            },
        )
        .with_context(|| self.log())?;
        ensure!(pending, "{alertname} fired without being pending first");
        Ok(())
    }

    /// The rules that fired since Prometheus started, from its `ALERTS` series.
    pub fn fired(&self) -> Result<BTreeSet<String>> {
        let expr = "count by (alertname) (count_over_time(ALERTS{alertstate=\"firing\"}[1h]))";
        Ok(self
            .query(expr)?
            .iter()
            .filter_map(|s| s["metric"]["alertname"].as_str().map(str::to_owned))
            .collect())
    }
}
