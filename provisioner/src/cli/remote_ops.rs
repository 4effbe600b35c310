//! CLI verbs answered by the daemon over its socket.

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, bail};

use provisioner::cni::{CniResult, CniVersion};
use provisioner::daemon::api::WhyAnswer;
use provisioner::daemon::api::{AllocationInfo, Request, Response, SandboxRequest, Status};
use provisioner::daemon::client;
use provisioner::pod::{Pod, PodName};
use provisioner::text::{escaped, escaped_lines};
use provisioner::trace::{Backend, ObservationStatus};

use super::SandboxArgs;
use super::local_ops::SandboxCommand;

const TIMEOUT: Duration = Duration::from_secs(60);

fn call(socket: &Path, request: &Request) -> Result<serde_json::Value> {
    match client::call(socket, request, TIMEOUT)? {
        Response::Ok { result } => Ok(result),
        Response::Error { code, msg, .. } => bail!("daemon error {code}: {msg}"),
    }
}

pub fn sandbox(op: SandboxCommand, args: &SandboxArgs) -> Result<()> {
    let req = SandboxRequest {
        container_id: args.container_id.clone(),
        ifname: args.ifname.clone(),
        netns: args.netns.clone(),
        network: None,
        prev_result: None,
        pod: args.pod(),
    };
    let (request, verb) = match op {
        SandboxCommand::Add => (Request::Add(req), "added"),
        SandboxCommand::Del => (Request::Del(req), "deleted"),
        SandboxCommand::Check => (Request::Check(req), "ok"),
    };
    let result = call(&args.socket, &request)?;
    if let SandboxCommand::Add = op {
        let parsed = CniResult::from_json(&result).map_err(|e| anyhow::anyhow!("{}", e.msg))?;
        if args.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&parsed.to_json(CniVersion::LATEST))?
            );
        } else {
            let ips: Vec<String> = parsed.ips.iter().map(|ip| ip.address.to_string()).collect();
            println!(
                "{verb} {} ({}): {}",
                args.container_id,
                args.ifname,
                ips.join(", ")
            );
        }
    } else if args.json {
        println!(
            "{}",
            serde_json::json!({"containerId": args.container_id, "ifname": args.ifname, "result": verb})
        );
    } else {
        println!("{verb}: {} ({})", args.container_id, args.ifname);
    }
    Ok(())
}

pub fn status(socket: &Path, json: bool) -> Result<bool> {
    let status: Status = serde_json::from_value(call(socket, &Request::Status)?)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(status.ready);
    }
    println!("ready: {}", if status.ready { "yes" } else { "NO" });
    for reason in &status.reasons {
        println!("  not ready because: {reason}");
    }
    match &status.network {
        Some(n) => println!(
            "network: {} from {} ranges {} mtu {}",
            n.name,
            n.file.display(),
            n.ranges.join(","),
            n.mtu
                .map_or_else(|| "default".to_owned(), |m| m.to_string())
        ),
        None => println!(
            "network: none loaded (source {})",
            status.config_source.display()
        ),
    }
    if let Some(load) = &status.last_load {
        let file = load
            .file
            .as_ref()
            .map_or_else(|| "-".to_owned(), |f| f.display().to_string());
        match &load.error {
            None => println!("last load: ok ({file})"),
            Some(err) => println!("last load: FAILED ({file}): {err}"),
        }
    }
    if let Some(n) = status.allocations {
        println!("allocations: {n}");
    }
    match &status.kernel_watch {
        None => println!("kernel watch: off (--no-trace)"),
        Some(watch) => {
            match &watch.unavailable {
                None => println!("kernel watch: running"),
                Some(why) => println!("kernel watch: not running: {why}"),
            }
            for observation in &watch.observations {
                println!("  {}", observation.line());
            }
        }
    }
    Ok(status.ready)
}

pub fn list(socket: &Path, json: bool) -> Result<()> {
    let result = call(socket, &Request::List)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&result)?);
        return Ok(());
    }
    let allocations: Vec<AllocationInfo> = serde_json::from_value(result)?;
    println!("POD\tCONTAINER\tIFNAME\tADDRESSES");
    for a in &allocations {
        println!(
            "{}\t{}\t{}\t{}",
            a.pod
                .as_ref()
                .map_or_else(|| "-".to_owned(), Pod::qualified_name),
            a.container_id,
            a.ifname,
            a.addresses.join(",")
        );
    }
    eprintln!("{} allocation(s)", allocations.len());
    Ok(())
}

/// The state asked of the daemon's kernel watch.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Switch {
    On,
    Off,
}

pub fn kernel_watch(socket: &Path, state: Switch, json: bool) -> Result<()> {
    let on = matches!(state, Switch::On);
    let result = call(socket, &Request::KernelWatch { on })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&result)?);
        return Ok(());
    }
    match result["tracing_unavailable"].as_str() {
        Some(reason) => println!("kernel watch {}: {reason}", if on { "on" } else { "off" }),
        None => println!("kernel watch on: tracing"),
    }
    Ok(())
}

/// `clones=btf_tracepoint rtnetlink=syscall_tracepoints (every syscall ...) ...`: each
/// observation's backend, with what it costs where it costs something.
fn backends_line(observations: &[ObservationStatus]) -> String {
    observations
        .iter()
        .map(|o| match o.backend {
            Some(b @ (Backend::BtfTracepoint | Backend::KernelCookie)) => {
                format!("{}={b}", o.observation)
            }
            Some(b) => format!("{}={b} ({})", o.observation, o.detail),
            None => format!("{}=unavailable ({})", o.observation, o.detail),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn sandboxes(
    socket: &Path,
    json: bool,
    pod: Option<String>,
    verdict: Option<String>,
) -> Result<()> {
    let result = call(socket, &Request::Sandboxes { pod, verdict })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&result)?);
        return Ok(());
    }
    if let Some(reason) = result["tracing_unavailable"].as_str() {
        println!("kernel tracing unavailable: {reason}");
    }
    let observations: Vec<ObservationStatus> =
        serde_json::from_value(result["metrics"]["observations"].clone()).unwrap_or_default();
    if !observations.is_empty() {
        println!("kernel watch: {}", backends_line(&observations));
    }
    let sandboxes = result["sandboxes"].as_array().cloned().unwrap_or_default();
    for view in &sandboxes {
        let pod = serde_json::from_value::<Option<PodName>>(view["pod"].clone())
            .ok()
            .flatten();
        let mut who = Vec::new();
        if let Some(pod) = pod.as_ref().and_then(PodName::known) {
            who.push(format!("pod {}", pod.qualified_name()));
        }
        if let Some(c) = view["container_id"].as_str() {
            who.push(format!("container {c}"));
        }
        let who = if who.is_empty() {
            String::new()
        } else {
            format!("{}: ", escaped(&who.join(" ")))
        };
        for line in view["text"].as_array().into_iter().flatten() {
            // Rendered by the daemon, line by line escaped already; escaped again in case an
            // older daemon did not.
            println!("{who}{}", escaped_lines(line.as_str().unwrap_or_default()));
        }
    }
    let absent = result["absent"].as_array().cloned().unwrap_or_default();
    for gone in &absent {
        let pod = serde_json::from_value::<Option<Pod>>(gone["pod"].clone())
            .ok()
            .flatten()
            .map(|p| format!("pod {} ", p.qualified_name()))
            .unwrap_or_default();
        let line = format!(
            "ABSENT {pod}container {} ({}) [{}]: {} ({})",
            gone["container_id"].as_str().unwrap_or("?"),
            gone["ifname"].as_str().unwrap_or("?"),
            gone["addresses"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            gone["what"].as_str().unwrap_or_default(),
            gone["at"].as_str().unwrap_or_default()
        );
        println!("{}", escaped(&line));
    }
    eprintln!("{} sandbox namespace(s)", sandboxes.len());
    Ok(())
}

/// `provisioner why NAMESPACE/NAME`; `false` when the daemon knows no sandbox of that pod.
pub fn why(socket: &Path, pod: &str, json: bool) -> Result<bool> {
    let answer: WhyAnswer = serde_json::from_value(call(
        socket,
        &Request::Why {
            pod: pod.to_owned(),
        },
    )?)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
    } else {
        for explanation in &answer.sandboxes {
            println!("{}", escaped_lines(explanation));
        }
    }
    if answer.sandboxes.is_empty() {
        let tracing = answer
            .tracing_unavailable
            .map(|why| format!(" (kernel tracing is not running: {why})"))
            .unwrap_or_default();
        eprintln!(
            "provisioner: the daemon knows no sandbox of pod {pod}{tracing}: no ADD named it and \
             the kernel watch has not seen its namespace (check the name with `kubectl get pods \
             -A`; `provisioner sandboxes` lists what the daemon saw)"
        );
    }
    Ok(!answer.sandboxes.is_empty())
}
