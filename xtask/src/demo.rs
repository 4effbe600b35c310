//! `cargo xtask demo`: the main job, told on the terminal for a newcomer.
//!
//! In private namespaces (a "node" netns for the host side, one per sandbox, all removed at the
//! end, also on failure): start the daemon on an empty conf dir (not ready, and why), render a
//! containerd-style template into it (ready), wire three sandboxes through the CNI plugin mode
//! exactly as a runtime does, look at one of them and ping across, list, delete, and show that
//! nothing is left. Then the loopback-only failure and its fix with the real containerd, driven
//! over CRI (tests/src/bin/demo_containerd.rs), when containerd is installed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::bench::{self, Daemon, Netns, Plugin};
use crate::release;
use crate::step::{announce, detail};

/// The node's pod CIDRs, dual-stack.
const POD_CIDRS: &str = "10.244.1.0/24,fd00:10:244:1::/64";
const SANDBOXES: usize = 3;

/// A conf template in containerd's `conf_template` syntax (Go text/template over .PodCIDRRanges
/// and .Routes); `@SOCKET@` is replaced by the demo daemon's socket.
const TEMPLATE: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "demo-pod-network",
  "plugins": [
    {
      "type": "provisioner",
      "mtu": 1460,
      "socket": "@SOCKET@",
      "ipam": {
        "ranges": [{{range $i, $range := .PodCIDRRanges}}{{if $i}}, {{end}}[{"subnet": "{{$range}}"}]{{end}}],
        "routes": [{{range $i, $route := .Routes}}{{if $i}}, {{end}}{"dst": "{{$route}}"}{{end}}]
      }
    }
  ]
}
"#;

/// Everything the demo has set up, for each part of the story.
pub struct DemoEnv<'a> {
    pub bin: PathBuf,
    pub node: &'a Netns,
    pub pods: &'a [Netns],
    /// The rendered conflist in the daemon's conf dir.
    pub conflist: Value,
}

pub fn run() -> Result<()> {
    bench::require_root("demo")?;
    let bin = release::build_dist()?;
    bench::catch_interrupt();
    let started = Instant::now();

    announce(
        "demo",
        "private namespaces: one \"node\" for the host side, one per sandbox",
    );
    let tmp = tempfile::Builder::new()
        .prefix("provisioner-demo")
        .tempdir()?;
    let node = Netns::new("node")?;
    let pods = bench::sandbox_namespaces("pod", SANDBOXES)?;
    detail(&format!(
        "node: {}; sandboxes: {}",
        node.name(),
        pods.iter().map(Netns::name).collect::<Vec<_>>().join(", ")
    ));

    announce("demo", "start the daemon on an empty conf dir");
    let mut daemon = Daemon::spawn(&bin, &node, tmp.path(), &["--trace-deadline", "2"])?;
    daemon.wait_listening(Duration::from_secs(10))?;
    detail(&format!(
        "pid {}, socket {}, conf dir {}, store {}, host side in netns {}",
        daemon.pid().unwrap_or_default(),
        daemon.socket.display(),
        daemon.conf_dir.display(),
        daemon.data_dir.display(),
        node.name()
    ));
    announce(
        "demo",
        "status while the conf dir is empty: not ready, and why",
    );
    cli(&bin, &["status", "--socket"], &daemon.socket)?;

    wait_tracing(&daemon)?;
    let conflist = render(&bin, &mut daemon, tmp.path())?;

    let release_bin = bin.clone();
    let env = DemoEnv {
        bin,
        node: &node,
        pods: &pods,
        conflist,
    };
    let plugin = Plugin {
        bin: env.bin.clone(),
        cni_path: env
            .bin
            .parent()
            .map_or_else(String::new, |p| p.display().to_string()),
        stdin: bench::plugin_stdin(&env.conflist)?,
        node: &node,
    };
    let results = add_sandboxes(&env, &plugin)?;
    look_at_one(&env, &results[0])?;
    announce("demo", "provisioner list");
    cli(&env.bin, &["list", "--socket"], &daemon.socket)?;

    tracing_part(&env, &daemon)?;
    let mut daemon = restart_part(&env, daemon, tmp.path())?;

    delete_sandboxes(&env, &daemon, &plugin)?;
    announce("demo", "stop the daemon (SIGTERM)");
    daemon.stop()?;
    detail("stopped");
    drop(env);
    drop(pods);
    drop(node);
    real_runtime_part(&release_bin)?;
    announce(
        "demo",
        &format!(
            "done in {:.1} s; namespaces and temp dir removed",
            started.elapsed().as_secs_f64()
        ),
    );
    Ok(())
}

/// What the real-runtime act needs on the node (`cargo xtask demo` installs them as root).
const REAL_RUNTIME_TOOLS: &[&str] = &["/usr/bin/containerd", "/usr/sbin/runc", "/bin/busybox"];

/// The loopback-only failure and its fix with the real containerd, driven over CRI: tests/src/bin/
/// demo_containerd.rs (it uses the tests' CRI client), running the demo's binary `bin`.
/// It is built in the dev profile, whose dependencies `cargo xtask test` has built already.
/// Without containerd the stand-in act above is the whole story, and the demo says so.
fn real_runtime_part(bin: &Path) -> Result<()> {
    let missing: Vec<&str> = REAL_RUNTIME_TOOLS
        .iter()
        .copied()
        .filter(|tool| !Path::new(tool).exists())
        .collect();
    if !missing.is_empty() {
        announce(
            "demo",
            &format!(
                "the real runtime act is skipped: {} not installed (the stand-in above told the \
                 story; install containerd, runc and busybox-static to see it with containerd)",
                missing.join(", ")
            ),
        );
        return Ok(());
    }
    announce(
        "build",
        "the real-runtime act (tests/src/bin/demo_containerd.rs)",
    );
    let root = crate::step::workspace_root();
    crate::step::run(crate::step::cargo("stable").current_dir(&root).args([
        "build",
        "-p",
        "provisioner-tests",
        "--bin",
        "demo_containerd",
    ]))?;
    let act = root.join("target/debug/demo_containerd");
    let status = Command::new(&act)
        .env("PROVISIONER_BIN", bin)
        .status()
        .with_context(|| format!("run {}", act.display()))?;
    if !status.success() {
        bail!("the real-runtime act failed: {status}");
    }
    Ok(())
}

/// Bound on the waits for the kernel watch (a loaded machine, a state read) and the reaper.
const PATIENCE: Duration = Duration::from_secs(30);

/// The daemon's view of the sandbox of `container_id` (its ADD's intent names it).
fn view_of<'a>(answer: &'a Value, container_id: &str) -> Option<&'a Value> {
    answer["sandboxes"]
        .as_array()?
        .iter()
        .find(|v| v["intent"]["intent"]["key"]["container_id"] == container_id)
}

/// Waits (bounded) until the view of each of the demo's sandboxes satisfies `done`.
fn wait_views(daemon: &Daemon, what: &str, done: impl Fn(&Value) -> bool) -> Result<Value> {
    let started = Instant::now();
    loop {
        let answer = daemon.request(&serde_json::json!({ "op": "sandboxes" }))?;
        let ready = (1..=SANDBOXES)
            .all(|i| view_of(&answer, &format!("demo-sandbox-{i}")).is_some_and(&done));
        if ready {
            return Ok(answer);
        }
        if started.elapsed() > PATIENCE {
            bail!(
                "the kernel watch did not show {what} within {PATIENCE:?}: {answer:#}\n{}",
                daemon.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn networked_and_confirmed(view: &Value) -> bool {
    view["verdict"]["verdict"] == "networked" && view["intent"]["status"] == "confirmed"
}

/// Prints the first line of each of the watch's reports on the demo's sandboxes (the machine
/// may hold others).
fn show_views(answer: &Value) {
    for i in 1..=SANDBOXES {
        let container_id = format!("demo-sandbox-{i}");
        let Some(view) = view_of(answer, &container_id) else {
            continue;
        };
        for text in view["text"].as_array().into_iter().flatten() {
            if let Some(first) = text.as_str().and_then(|t| t.lines().next()) {
                println!("      {first}");
            }
        }
    }
}

/// The eBPF tracing part of the story: the kernel confirms the daemon's own sandboxes, and a
/// sandbox that a runtime creates and deletes without ever asking for network (containerd 1.6
/// with a loopback-only config) is flagged `skipped`, with its timeline.
fn tracing_part(env: &DemoEnv, daemon: &Daemon) -> Result<()> {
    announce(
        "demo",
        "the kernel's view of the three sandboxes: networked, and each ADD confirmed",
    );
    let answer = wait_views(
        daemon,
        "the sandboxes networked and confirmed",
        networked_and_confirmed,
    )?;
    show_views(&answer);

    announce(
        "demo",
        "the motivating failure: a runtime creates a sandbox netns, brings up only lo, deletes it 30 ms later",
    );
    let runtime = stand_in_runtime(env)?;
    let name = format!("cni-provisioner-demo-{}", std::process::id());
    run_runtime(&runtime, &["netns", "add", &name])?;
    let lo = run_runtime(&runtime, &["-n", &name, "link", "set", "lo", "up"]);
    std::thread::sleep(Duration::from_millis(30));
    let del = run_runtime(&runtime, &["netns", "del", &name]);
    lo?;
    del?;
    detail(&format!(
        "/run/netns/{name}: created by {} (a stand-in named containerd), lo up, deleted; \
         no CNI plugin was ever called",
        runtime.display()
    ));
    announce(
        "demo",
        "provisioner sandboxes: the skipped sandbox, with its timeline",
    );
    let started = Instant::now();
    let skipped = loop {
        let answer = daemon.request(&serde_json::json!({ "op": "sandboxes" }))?;
        let found = answer["sandboxes"].as_array().and_then(|views| {
            views
                .iter()
                .find(|v| {
                    v["verdict"]["verdict"] == "skipped"
                        && v["verdict"]["timeline"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|e| e["path"].as_str().is_some_and(|p| p.ends_with(&name)))
                })
                .cloned()
        });
        if let Some(view) = found {
            break view;
        }
        if started.elapsed() > PATIENCE {
            bail!(
                "no skipped verdict for {name} within {PATIENCE:?}\n{}",
                daemon.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for text in skipped["text"].as_array().into_iter().flatten() {
        print_indented(text.as_str().unwrap_or_default());
    }
    Ok(())
}

/// The restart case: the daemon stops, starts again, and audits the sandboxes already there
/// against the kernel (their history before its start was not seen: their state is read).
fn restart_part(env: &DemoEnv, mut daemon: Daemon, dir: &Path) -> Result<Daemon> {
    announce(
        "demo",
        "restart: stop the daemon, start it again; the live sandboxes are audited",
    );
    daemon.stop()?;
    drop(daemon);
    let daemon = Daemon::spawn(&env.bin, env.node, dir, &["--trace-deadline", "2"])?;
    daemon.wait_ready(Duration::from_secs(10))?;
    detail(&format!(
        "started again, pid {}",
        daemon.pid().unwrap_or_default()
    ));
    wait_tracing(&daemon)?;
    let answer = wait_views(&daemon, "the audit of the live sandboxes", |view| {
        networked_and_confirmed(view) && view["intent"]["intent"]["origin"] == "audit"
    })?;
    show_views(&answer);
    Ok(daemon)
}

/// A copy of `ip` named `containerd`: the demo's stand-in runtime (the namespaces it creates
/// have a runtime as creator, as containerd's would).
fn stand_in_runtime(env: &DemoEnv) -> Result<PathBuf> {
    let dir = env
        .bin
        .parent()
        .context("the binary's directory")?
        .join("demo-runtime");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("containerd");
    std::fs::copy("/usr/sbin/ip", &path).context("copy /usr/sbin/ip")?;
    Ok(path)
}

fn run_runtime(runtime: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new(runtime).args(args).output()?;
    if !out.status.success() {
        bail!(
            "{} {}: {}",
            runtime.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Waits (bounded) until the daemon's kernel watch is attached, so the ADDs below are traced;
/// fails, saying why, when it does not.
fn wait_tracing(daemon: &Daemon) -> Result<()> {
    let started = Instant::now();
    daemon.wait_tracing(PATIENCE)?;
    detail(&format!(
        "kernel tracing attached ({} ms after the socket opened)",
        started.elapsed().as_millis()
    ));
    Ok(())
}

/// Writes the template, renders it into the conf dir, waits for ready; the rendered conflist.
fn render(bin: &Path, daemon: &mut Daemon, dir: &Path) -> Result<Value> {
    announce(
        "demo",
        "render a containerd-style conf template from the node's pod CIDRs",
    );
    let template = dir.join("cni.template");
    std::fs::write(
        &template,
        TEMPLATE.replace("@SOCKET@", &daemon.socket.display().to_string()),
    )?;
    let output = daemon.conf_dir.join("10-provisioner.conflist");
    detail(&format!(
        "template {} (ranges from .PodCIDRRanges, routes from .Routes)",
        template.display()
    ));
    let template_arg = template.display().to_string();
    let output_arg = output.display().to_string();
    show_command(
        bin,
        &[
            "render-config",
            "--template",
            &template_arg,
            "--pod-cidr",
            POD_CIDRS,
            "--output",
            &output_arg,
        ],
    )?;
    let rendered: Value = serde_json::from_slice(&std::fs::read(&output)?)
        .with_context(|| format!("rendered {}", output.display()))?;
    let ipam = &rendered["plugins"][0]["ipam"];
    detail(&format!(
        "rendered ipam: ranges {} routes {}",
        ipam["ranges"], ipam["routes"]
    ));
    let waited = Instant::now();
    daemon
        .wait_ready(Duration::from_secs(10))
        .context("the daemon after the render")?;
    announce(
        "demo",
        &format!(
            "status after the render (ready {:.0} ms after the file appeared)",
            waited.elapsed().as_secs_f64() * 1e3
        ),
    );
    cli(bin, &["status", "--socket"], &daemon.socket)?;
    Ok(rendered)
}

/// The `CNI_ARGS` a Kubernetes runtime passes for the demo's sandbox `i`: its pod.
fn pod_args(i: usize) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME=web-{i};K8S_POD_UID=demo-uid-{i};\
         K8S_POD_INFRA_CONTAINER_ID=demo-sandbox-{}",
        i + 1
    )
}

/// What one ADD gave a sandbox.
struct Wired {
    pod: usize,
    container_id: String,
    v4: Option<String>,
    gateway_v4: Option<String>,
    v6: Option<String>,
}

fn add_sandboxes(env: &DemoEnv, plugin: &Plugin) -> Result<Vec<Wired>> {
    announce(
        "demo",
        &format!(
            "{SANDBOXES} sandboxes through the CNI plugin mode, as a runtime calls it \
             (CNI_COMMAND=ADD, config on stdin)"
        ),
    );
    let mut wired = Vec::new();
    for (i, pod) in env.pods.iter().enumerate() {
        bench::check_interrupted()?;
        let container_id = format!("demo-sandbox-{}", i + 1);
        let run = plugin.exec_ok_with_args("ADD", &container_id, pod.path(), &pod_args(i))?;
        let result = run.json();
        let ips = result["ips"].as_array().cloned().unwrap_or_default();
        let find = |v6: bool| {
            ips.iter()
                .find(|ip| {
                    ip["address"]
                        .as_str()
                        .is_some_and(|a| a.contains(':') == v6)
                })
                .cloned()
        };
        let v4 = find(false);
        let v6 = find(true);
        let host_if = result["interfaces"]
            .as_array()
            .and_then(|ifs| ifs.iter().find(|i| i.get("sandbox").is_none()))
            .and_then(|i| i["name"].as_str())
            .unwrap_or("?")
            .to_owned();
        let addresses: Vec<String> = ips
            .iter()
            .map(|ip| {
                format!(
                    "{} gw {}",
                    ip["address"].as_str().unwrap_or("?"),
                    ip["gateway"].as_str().unwrap_or("-")
                )
            })
            .collect();
        println!(
            "      {container_id} in {}: eth0 {}; host veth {host_if}; {:.1} ms",
            pod.path().display(),
            addresses.join(", "),
            run.elapsed.as_secs_f64() * 1e3
        );
        if i == 0 {
            println!(
                "      CNI result ({}): {}",
                result["cniVersion"].as_str().unwrap_or("?"),
                serde_json::to_string(&result)?
            );
        }
        let addr = |ip: &Option<Value>| {
            ip.as_ref().and_then(|ip| {
                ip["address"]
                    .as_str()
                    .and_then(|a| a.split('/').next())
                    .map(str::to_owned)
            })
        };
        wired.push(Wired {
            pod: i,
            container_id,
            v4: addr(&v4),
            gateway_v4: v4
                .as_ref()
                .and_then(|ip| ip["gateway"].as_str().map(str::to_owned)),
            v6: addr(&v6),
        });
    }
    Ok(wired)
}

fn look_at_one(env: &DemoEnv, one: &Wired) -> Result<()> {
    let pod = &env.pods[one.pod];
    announce(
        "demo",
        &format!("inside {} ({})", one.container_id, pod.name()),
    );
    show_ip(pod, &["addr", "show", "dev", "eth0"])?;
    show_ip(pod, &["route"])?;
    show_ip(pod, &["-6", "route"])?;
    announce("demo", "the node side (host veths and a route per sandbox)");
    show_ip(env.node, &["-br", "addr"])?;
    show_ip(env.node, &["route"])?;

    let gateway = one
        .gateway_v4
        .as_deref()
        .context("no IPv4 gateway in the ADD result")?;
    let pod_v4 = one
        .v4
        .as_deref()
        .context("no IPv4 address in the ADD result")?;
    announce("demo", &format!("ping sandbox -> gateway {gateway}"));
    ping(pod, &[gateway])?;
    announce("demo", &format!("ping node -> sandbox {pod_v4}"));
    ping(env.node, &[pod_v4])?;
    if let Some(v6) = &one.v6 {
        announce("demo", &format!("ping node -> sandbox {v6} (IPv6)"));
        if let Err(err) = ping(env.node, &["-6", "-w", "4", v6]) {
            detail(&format!(
                "IPv6 ping failed (not fatal for the demo): {err:#}"
            ));
        }
    }
    Ok(())
}

fn delete_sandboxes(env: &DemoEnv, daemon: &Daemon, plugin: &Plugin) -> Result<()> {
    announce(
        "demo",
        &format!("DEL the {SANDBOXES} sandboxes through the plugin mode"),
    );
    for (i, pod) in env.pods.iter().enumerate() {
        let container_id = format!("demo-sandbox-{}", i + 1);
        let run = plugin.exec_ok_with_args("DEL", &container_id, pod.path(), &pod_args(i))?;
        println!(
            "      {container_id}: deleted in {:.1} ms",
            run.elapsed.as_secs_f64() * 1e3
        );
    }
    announce(
        "demo",
        "nothing left: allocations, node links (retired veths are deleted in the background), sandbox links",
    );
    cli(&env.bin, &["list", "--socket"], &daemon.socket)?;
    let started = Instant::now();
    let node_links = loop {
        let links = env.node.links()?;
        if links.is_empty() || started.elapsed() > PATIENCE {
            break links;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    println!(
        "      node {}: {}",
        env.node.name(),
        if node_links.is_empty() {
            format!(
                "only lo (the reaper deleted the retired veths within {} ms)",
                started.elapsed().as_millis()
            )
        } else {
            node_links.join(" ")
        }
    );
    let mut left = node_links.len();
    for pod in env.pods {
        let links = pod.links()?;
        left += links.len();
        println!(
            "      {}: {}",
            pod.name(),
            if links.is_empty() {
                "only lo".to_owned()
            } else {
                links.join(" ")
            }
        );
    }
    if left > 0 {
        bail!("{left} link(s) left {PATIENCE:?} after DEL");
    }
    Ok(())
}

/// Runs `bin <args> <socket>` and prints what it says (exit status other than 0 is shown, not
/// fatal: `status` exits 3 when not ready).
fn cli(bin: &Path, args: &[&str], socket: &Path) -> Result<()> {
    let socket = socket.display().to_string();
    let mut full = args.to_vec();
    full.push(&socket);
    show_command(bin, &full)
}

fn show_command(bin: &Path, args: &[&str]) -> Result<()> {
    println!("    $ provisioner {}", args.join(" "));
    let out = Command::new(bin)
        .args(args)
        .output()
        .with_context(|| format!("run {}", bin.display()))?;
    print_indented(&String::from_utf8_lossy(&out.stdout));
    print_indented(&String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        println!("      (exit status {})", out.status.code().unwrap_or(-1));
    }
    Ok(())
}

fn show_ip(netns: &Netns, args: &[&str]) -> Result<()> {
    println!("    $ ip -n {} {}", netns.name(), args.join(" "));
    print_indented(&netns.ip(args)?);
    Ok(())
}

/// Pings from inside `netns` (the child enters it with setns before exec).
fn ping(netns: &Netns, args: &[&str]) -> Result<()> {
    let mut cmd = Command::new("ping");
    cmd.args(["-c", "1", "-W", "2"]).args(args);
    netns.enter(&mut cmd)?;
    let out = cmd.output().context("run ping")?;
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text
        .lines()
        .filter(|l| l.contains("bytes from") || l.contains("packet loss"))
    {
        println!("      {line}");
    }
    if !out.status.success() {
        bail!(
            "ping {} from {} failed: {}",
            args.join(" "),
            netns.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn print_indented(text: &str) {
    for line in text.lines() {
        println!("      {line}");
    }
}
