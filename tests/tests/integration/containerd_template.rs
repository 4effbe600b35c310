//! containerd's own template path, as a Kubernetes node uses it: the kubelet passes the node's
//! pod CIDR with CRI UpdateRuntimeConfig, containerd renders its `conf_template` into the conf
//! dir, and provisioner, watching the same dir, becomes ready from that file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use provisioner_tests::containerd::{CniSetup, Containerd};
use provisioner_tests::daemon_harness::Daemon;
use provisioner_tests::daemon_queries::allocations;
use provisioner_tests::pod_net::{check_pod_network, wait_node_bare};
use provisioner_tests::{Netns, deploy, provisioner_bin, run};

/// What containerd 1.6 names the file it renders.
const RENDERED: &str = "10-containerd-net.conflist";
const POD_CIDRS: &str = "10.252.0.0/24,fd00:252::/64";
const PODS: usize = 3;

/// Waits (bounded) until containerd has rendered its template and loaded the result (containerd
/// 1.6 writes the file in place: only once it reports NetworkReady is the file complete); returns
/// the file's bytes.
fn wait_rendered(containerd: &mut Containerd) -> Result<Vec<u8>> {
    containerd
        .cri()
        .wait_network_ready(true, Duration::from_secs(10))
        .with_context(|| format!("containerd log:\n{}", containerd.log()))?;
    let path = containerd.conf_dir.join(RENDERED);
    std::fs::read(&path)
        .with_context(|| format!("read what containerd rendered, {}", path.display()))
}

/// `provisioner render-config` of `template` for `pod_cidrs` into `output`.
fn render_config(template: &Path, pod_cidrs: &str, output: &Path) -> Result<()> {
    run(
        &provisioner_bin().display().to_string(),
        &[
            "render-config",
            "--template",
            &template.display().to_string(),
            "--pod-cidr",
            pod_cidrs,
            "--output",
            &output.display().to_string(),
        ],
    )
    .map(|_| ())
}

/// What `provisioner render-config` writes for `template` and `pod_cidrs`.
fn render_with_provisioner(template: &Path, pod_cidrs: &str) -> Result<Vec<u8>> {
    let dir = tempfile::tempdir()?;
    let output = dir.path().join(RENDERED);
    render_config(template, pod_cidrs, &output)?;
    Ok(std::fs::read(&output)?)
}

/// One containerd rendering template after template: before each, the previous render is
/// removed, which makes containerd reload its (now empty) conf dir and report NetworkReady
/// false again, the one state in which it renders on UpdateRuntimeConfig.
struct Renderer {
    containerd: Containerd,
    template: PathBuf,
}

impl Renderer {
    fn start(node: &Netns) -> Result<Self> {
        let containerd = Containerd::start(
            node,
            &CniSetup {
                template: Some(String::new()),
                ..CniSetup::default()
            },
        )?;
        let template = containerd
            .template
            .clone()
            .context("containerd was started with a template")?;
        Ok(Self {
            containerd,
            template,
        })
    }

    /// What containerd renders from `template` for `pod_cidrs`, and what render-config does.
    fn both(&mut self, template: &str, pod_cidrs: &str) -> Result<(Vec<u8>, Vec<u8>)> {
        let rendered = self.containerd.conf_dir.join(RENDERED);
        if rendered.exists() {
            std::fs::remove_file(&rendered)?;
        }
        self.containerd
            .cri()
            .wait_network_ready(false, Duration::from_secs(10))?;
        std::fs::write(&self.template, template)?;
        self.containerd.cri().update_pod_cidr(pod_cidrs)?;
        let theirs = wait_rendered(&mut self.containerd)?;
        let ours = render_with_provisioner(&self.template, pod_cidrs)?;
        Ok((theirs, ours))
    }
}

/// containerd's own templates, kept once for this test and the provisioner's unit tests.
const CONTAINERD_REFERENCE: &str =
    include_str!("../../../provisioner/tests/fixtures/containerd-templates/reference.tmpl");
const CONTAINERD_GCE: &str =
    include_str!("../../../provisioner/tests/fixtures/containerd-templates/gce.tmpl");

fn assert_same(theirs: &[u8], ours: &[u8], what: &str) {
    assert!(
        theirs == ours,
        "{what}: containerd rendered\n{}\nprovisioner rendered\n{}",
        String::from_utf8_lossy(theirs),
        String::from_utf8_lossy(ours)
    );
}

#[test]
fn kubelet_pod_cidr_renders_the_deploy_template_and_pods_get_network() -> Result<()> {
    let node = Netns::new("node")?;
    let daemon = Daemon::start_with(&node, None, &["--trace-deadline", "2"])?;
    // The DaemonSet's template, pointed at this test's daemon instead of /run/provisioner.
    let mut containerd = Containerd::start(&node, &CniSetup::deploy_template_for(&daemon)?)?;
    // Nothing to load yet: neither is ready.
    assert!(!containerd.cri().conditions()?.network_ready);
    assert_eq!(daemon.status()?["ready"], false);

    containerd.cri().update_pod_cidr(POD_CIDRS)?;
    let theirs = wait_rendered(&mut containerd)?;
    daemon.wait_ready(Duration::from_secs(10))?;
    let network = &daemon.status()?["network"];
    assert_eq!(
        network["file"],
        daemon.conf_dir.join(RENDERED).display().to_string()
    );
    assert_eq!(
        network["ranges"],
        serde_json::json!(["10.252.0.0/24", "fd00:252::/64"])
    );
    let template_path = containerd.template.clone().context("template path")?;
    assert_same(
        &theirs,
        &render_with_provisioner(&template_path, POD_CIDRS)?,
        "deploy template",
    );

    let mut pods = Vec::new();
    for i in 0..PODS {
        let ready = containerd
            .run_ready_pod(&format!("tpl-{i}"))
            .with_context(|| daemon.log())?;
        let [v4, v6] = ready.ips.as_slice() else {
            bail!("a dual-stack pod with addresses {:?}", ready.ips);
        };
        assert!(v4.starts_with("10.252.0."), "{v4}");
        assert!(v6.starts_with("fd00:252::"), "{v6}");
        for ip in [v4, v6] {
            check_pod_network(&ready.netns, ip)?;
            node.ping(ip)?;
        }
        pods.push(ready.pod);
    }
    assert_eq!(allocations(&daemon)?.len(), PODS);
    for pod in &pods {
        containerd.cri().stop_pod(&pod.id)?;
        containerd.cri().remove_pod(&pod.id)?;
    }
    assert!(allocations(&daemon)?.is_empty());
    wait_node_bare(&node, Duration::from_secs(20))?;
    containerd.shutdown()
}

/// Templates written for containerd's renderer give the same bytes with `render-config`.
#[test]
fn templates_render_byte_for_byte_like_containerd() -> Result<()> {
    // Go template features beyond field access: functions (printf with %q, widths and %%),
    // pipelines, comparisons, with, if/else, variables, trim markers, comments.
    const FEATURES: &str = r#"{{- /* comment */ -}}
{"cniVersion": "1.0.0", "name": "features",
 "plugins": [{"type": "ptp", "ipam": {"type": "host-local", "subnet": "{{printf "%s" .PodCIDR}}"}}],
 "count": {{len .PodCIDRRanges}},
 "first": "{{index .PodCIDRRanges 0}}",
 "with": "{{with .PodCIDR}}{{.}}{{end}}",
 "family": "{{if eq (len .Routes) 2}}dual{{else}}single{{end}}",
 "routes": "{{range .Routes}}{{.}} {{end}}",
 "joined": "{{- range $i, $r := .PodCIDRRanges}}{{if gt $i 0}},{{end}}{{$r}}{{end -}}",
 "logic": "{{if and .PodCIDR (not (eq .PodCIDR "x"))}}yes{{end}}",
 "piped": "{{.PodCIDR | print "cidr="}}",
 "quoted": {{printf "%q" .PodCIDR}},
 "padded": "{{printf "%-20s|%d%%" .PodCIDR 100}}"
}
"#;
    let node = Netns::new("node")?;
    let mut renderer = Renderer::start(&node)?;
    let template = deploy::cni_template()?;
    for (what, template, cidrs) in [
        ("deploy template, IPv4", template.as_str(), "10.244.3.0/24"),
        (
            "deploy template, IPv6",
            template.as_str(),
            "fd00:10:244:3::/64",
        ),
        (
            "deploy template, dual-stack with spaces",
            template.as_str(),
            " fd00:10:244:3::/64 , 10.244.3.0/24",
        ),
        ("reference plugins", CONTAINERD_REFERENCE, "10.244.3.0/24"),
        ("GCE, IPv4", CONTAINERD_GCE, "10.244.3.0/24"),
        (
            "GCE, dual-stack",
            CONTAINERD_GCE,
            "10.244.3.0/24,fd00:10:244:3::/64",
        ),
        (
            "template features",
            FEATURES,
            "10.244.3.0/24,fd00:10:244:3::/64",
        ),
    ] {
        let (theirs, ours) = renderer.both(template, cidrs)?;
        assert_same(&theirs, &ours, what);
    }
    renderer.containerd.shutdown()
}

/// A node where provisioner renders the template itself (`render-config`, or the daemon's
/// `--template`) into the dir containerd reads: containerd notices the file. (containerd 1.6
/// ignores CREATE events, so a file moved into the dir from elsewhere is not loaded.)
#[test]
fn containerd_loads_what_render_config_writes() -> Result<()> {
    let node = Netns::new("node")?;
    let mut containerd = Containerd::start(&node, &CniSetup::default())?;
    assert!(!containerd.cri().conditions()?.network_ready);
    let dir = tempfile::tempdir()?;
    let template = dir.path().join("cni.template");
    std::fs::write(&template, deploy::cni_template()?)?;
    render_config(
        &template,
        "10.244.7.0/24",
        &containerd.conf_dir.join("10-provisioner.conflist"),
    )?;
    containerd
        .cri()
        .wait_network_ready(true, Duration::from_secs(10))?;
    containerd.shutdown()
}
