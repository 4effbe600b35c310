//! `provisioner render-config`: renders a containerd CNI `conf_template` for the node's pod
//! CIDRs and writes the result atomically, only once it is known to be a valid config.
//!
//! The template is Go `text/template` (rendered with `gtmpl`) over the same data containerd
//! gives it, so existing template files render unchanged:
//! - `.PodCIDR`: the first pod CIDR,
//! - `.PodCIDRRanges`: every pod CIDR, as given, in order (`[]string`),
//! - `.Routes`: `"0.0.0.0/0"` if any pod CIDR is IPv4, then `"::/0"` if any is IPv6 (`[]string`).
//!
//! Unlike containerd, which executes the template straight into the target file, the output
//! is checked first: it must be JSON, and if it holds a `provisioner` plugin that network must
//! validate. Only then is it written ([`write_atomically`]: temp file in the same dir, write,
//! fsync, rename, fsync the dir), so a runtime watching the dir never sees a partial or invalid
//! file, and a rejected render leaves the previous file untouched.
//!
//! - `pod_cidrs`: the `--pod-cidr` values and the `.Routes` they make;
//! - `gtmpl_guards`: template text that gtmpl cannot lex, refused before it panics or hangs;
//! - `go_printf`: `printf` as Go's, where gtmpl's differs.

mod go_printf;
mod gtmpl_guards;
mod pod_cidrs;

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use ipnetwork::IpNetwork;

use super::ConfigError;
use super::atomic_write::write_atomically;
use super::network::{FileKind, NetworkConfig, parse_network};
use go_printf::go_printf;
use gtmpl_guards::gtmpl_unlexable;
pub use pod_cidrs::{ZERO_CIDR_V4, ZERO_CIDR_V6, parse_pod_cidrs, routes_for, validate_pod_cidrs};

/// Renders template text for the pod CIDRs with containerd's template data.
///
/// # Errors
/// [`ConfigError::PodCidr`] if the CIDRs are not valid, [`ConfigError::Template`] if the
/// template does not parse or execute.
pub fn render_template(text: &str, pod_cidrs: &[IpNetwork]) -> Result<String, ConfigError> {
    validate_pod_cidrs(pod_cidrs)?;
    let ranges: Vec<String> = pod_cidrs.iter().map(ToString::to_string).collect();
    let mut data: HashMap<String, gtmpl::Value> = HashMap::new();
    data.insert("PodCIDR".to_owned(), ranges[0].clone().into());
    data.insert("Routes".to_owned(), routes_for(pod_cidrs).into());
    data.insert("PodCIDRRanges".to_owned(), ranges.into());

    let template_err = |reason: String| ConfigError::Template { path: None, reason };
    if let Some((line, what)) = gtmpl_unlexable(text) {
        return Err(template_err(format!("parse: line {line}: {what}")));
    }
    let mut tmpl = gtmpl::Template::default();
    tmpl.add_func("printf", go_printf);
    tmpl.parse(text)
        .map_err(|e| template_err(format!("parse: {e}")))?;
    tmpl.render(&gtmpl::Context::from(gtmpl::Value::Object(data)))
        .map_err(|e| template_err(format!("execute: {e}")))
}

/// Checks rendered text before it becomes `output`: it must be JSON, and if it holds our
/// plugin, our network must validate. Returns our config if it is one of ours.
///
/// # Errors
/// [`ConfigError::Json`], [`ConfigError::NotANetwork`] or [`ConfigError::Invalid`], naming
/// `output` (the file it would have become).
pub fn check_rendered(output: &Path, text: &str) -> Result<Option<NetworkConfig>, ConfigError> {
    // Always JSON first, whatever the extension: a runtime will parse it.
    serde_json::from_str::<serde_json::Value>(text).map_err(|source| ConfigError::Json {
        path: output.to_owned(),
        source,
    })?;
    match FileKind::of(output) {
        Some(kind) => Ok(parse_network(output, kind, text.as_bytes())?
            .ours
            .map(|(_, c)| c)),
        None => Ok(None),
    }
}

/// What [`render_config`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum RenderOutcome {
    /// `output` was written.
    Written { ours: Option<NetworkConfig> },
    /// `output` already had exactly this content: not rewritten (no spurious reload event).
    Unchanged { ours: Option<NetworkConfig> },
}

/// The `render-config` backend: reads `template`, renders it for `pod_cidrs`, checks the
/// result, and writes it atomically to `output` unless it already has that content.
///
/// # Errors
/// Any [`ConfigError`]; a rendered config that fails the checks is
/// [`ConfigError::Rendered`] and nothing is written.
pub fn render_config(
    template: &Path,
    pod_cidrs: &[IpNetwork],
    output: &Path,
) -> Result<RenderOutcome, ConfigError> {
    let text = fs::read_to_string(template).map_err(|source| ConfigError::Read {
        path: template.to_owned(),
        source,
    })?;
    let rendered = render_template(&text, pod_cidrs).map_err(|e| match e {
        ConfigError::Template { reason, .. } => ConfigError::Template {
            path: Some(template.to_owned()),
            reason,
        },
        other => other,
    })?;
    let ours = check_rendered(output, &rendered).map_err(|e| ConfigError::Rendered {
        output: output.to_owned(),
        source: Box::new(e),
    })?;
    if fs::read(output).is_ok_and(|old| old == rendered.as_bytes()) {
        return Ok(RenderOutcome::Unchanged { ours });
    }
    write_atomically(output, rendered.as_bytes(), 0o644).map_err(|source| ConfigError::Write {
        path: output.to_owned(),
        source,
    })?;
    Ok(RenderOutcome::Written { ours })
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests fail loudly on unexpected input")]
mod tests {
    use super::*;

    /// containerd's GCE-style template (containerd's `conf_template` for GKE/GCE nodes), verbatim;
    /// the containerd test renders it with containerd too.
    pub(super) const GCE_TEMPLATE: &str =
        include_str!("../../../tests/fixtures/containerd-templates/gce.tmpl");

    /// containerd's documented single-stack template for the reference plugins, verbatim.
    const REFERENCE_TEMPLATE: &str =
        include_str!("../../../tests/fixtures/containerd-templates/reference.tmpl");

    /// The template of containerd's own `TestUpdateRuntimeConfig`, verbatim: note the trailing
    /// comma after the plugin, so its output is not JSON (containerd writes it anyway).
    const CONTAINERD_TEST_TEMPLATE: &str = "
{
\t\"name\": \"test-pod-network\",
\t\"cniVersion\": \"1.0.0\",
\t\"plugins\": [
\t{
\t\t\"type\": \"ptp\",
\t\t\"mtu\": 1460,
\t\t\"ipam\": {
\t\t\t\"type\": \"host-local\",
\t\t\t\"subnet\": \"{{.PodCIDR}}\",
\t\t\t\"ranges\": [{{range $i, $range := .PodCIDRRanges}}{{if $i}}, {{end}}[{\"subnet\": \"{{$range}}\"}]{{end}}],
\t\t\t\"routes\": [{{range $i, $route := .Routes}}{{if $i}}, {{end}}{\"dst\": \"{{$route}}\"}{{end}}]
\t\t}
\t},
\t]
}";

    const CONTAINERD_TEST_EXPECTED: &str = "
{
\t\"name\": \"test-pod-network\",
\t\"cniVersion\": \"1.0.0\",
\t\"plugins\": [
\t{
\t\t\"type\": \"ptp\",
\t\t\"mtu\": 1460,
\t\t\"ipam\": {
\t\t\t\"type\": \"host-local\",
\t\t\t\"subnet\": \"10.0.0.0/24\",
\t\t\t\"ranges\": [[{\"subnet\": \"10.0.0.0/24\"}], [{\"subnet\": \"2001:4860:4860::/64\"}]],
\t\t\t\"routes\": [{\"dst\": \"0.0.0.0/0\"}, {\"dst\": \"::/0\"}]
\t\t}
\t},
\t]
}";

    /// A template written for provisioner, with comments and trim markers.
    const OUR_TEMPLATE: &str = r#"{{- /* provisioner network for this node */ -}}
{
  "cniVersion": "1.0.0",
  "name": "pod-network",
  "plugins": [
    {
      "type": "provisioner",
      "mtu": 1460,
      "socket": "/run/provisioner/provisioner.sock",
      "ipam": {
        "type": "host-local",
        "ranges": [
          {{- range $i, $range := .PodCIDRRanges}}{{if $i}},{{end}}
          [{"subnet": "{{$range}}"}]
          {{- end}}
        ],
        "routes": [{{range $i, $route := .Routes}}{{if $i}}, {{end}}{"dst": "{{$route}}"}{{end}}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
"#;

    /// The pod CIDRs of a `--pod-cidr` value.
    pub(super) fn cidrs(s: &str) -> Vec<IpNetwork> {
        parse_pod_cidrs(s).unwrap()
    }

    fn ipam_of(rendered: &str) -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_str(rendered).unwrap();
        v["plugins"][0]["ipam"].clone()
    }

    #[test]
    fn containerd_test_template_renders_byte_for_byte() {
        let out = render_template(
            CONTAINERD_TEST_TEMPLATE,
            &cidrs("10.0.0.0/24, 2001:4860:4860::/64"),
        )
        .unwrap();
        assert_eq!(out, CONTAINERD_TEST_EXPECTED);
    }

    #[test]
    fn reference_template_takes_the_first_pod_cidr() {
        let out = render_template(
            REFERENCE_TEMPLATE,
            &cidrs("10.244.1.0/24,fd00:10:244:1::/64"),
        )
        .unwrap();
        assert_eq!(
            ipam_of(&out),
            serde_json::json!({"type": "host-local",
                "subnet": "10.244.1.0/24", "routes": [{"dst": "0.0.0.0/0"}]})
        );
    }

    #[test]
    fn gce_template_ipv4() {
        let out = render_template(GCE_TEMPLATE, &cidrs("10.244.1.0/24")).unwrap();
        assert!(
            out.contains(r#""ranges": [[{"subnet": "10.244.1.0/24"}]],"#),
            "{out}"
        );
        assert!(out.contains(r#""routes": [{"dst": "0.0.0.0/0"}]"#), "{out}");
        assert_eq!(
            ipam_of(&out),
            serde_json::json!({"type": "host-local",
                "ranges": [[{"subnet": "10.244.1.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]})
        );
    }

    #[test]
    fn gce_template_ipv6() {
        let out = render_template(GCE_TEMPLATE, &cidrs("fd00:10:244:1::/64")).unwrap();
        assert!(
            out.contains(r#""ranges": [[{"subnet": "fd00:10:244:1::/64"}]],"#),
            "{out}"
        );
        assert!(out.contains(r#""routes": [{"dst": "::/0"}]"#), "{out}");
    }

    #[test]
    fn gce_template_dual_stack() {
        let out =
            render_template(GCE_TEMPLATE, &cidrs("10.244.1.0/24,fd00:10:244:1::/64")).unwrap();
        assert!(
            out.contains(
                r#""ranges": [[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:10:244:1::/64"}]],"#
            ),
            "{out}"
        );
        assert!(
            out.contains(r#""routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]"#),
            "{out}"
        );
        // v6 first: routes still v4 then v6, as containerd computes them.
        let out =
            render_template(GCE_TEMPLATE, &cidrs("fd00:10:244:1::/64,10.244.1.0/24")).unwrap();
        assert!(
            out.contains(r#""routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]"#),
            "{out}"
        );
        assert!(
            check_rendered(Path::new("/x/10-containerd-net.conflist"), &out)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn our_template_renders_a_valid_network_for_each_family() {
        for (pods, routes) in [
            ("10.244.1.0/24", vec!["0.0.0.0/0"]),
            ("fd00:10:244:1::/64", vec!["::/0"]),
            (
                "10.244.1.0/24,fd00:10:244:1::/64",
                vec!["0.0.0.0/0", "::/0"],
            ),
        ] {
            let nets = cidrs(pods);
            let out = render_template(OUR_TEMPLATE, &nets).unwrap();
            let ours = check_rendered(Path::new("/x/10-pod.conflist"), &out)
                .unwrap()
                .unwrap_or_else(|| panic!("not ours: {out}"));
            assert_eq!(ours.mtu, Some(1460));
            let ranges: Vec<String> = ours.ipam["ranges"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r[0]["subnet"].as_str().unwrap().to_owned())
                .collect();
            assert_eq!(ranges, pods.split(',').collect::<Vec<_>>());
            let got: Vec<&str> = ours.ipam["routes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["dst"].as_str().unwrap())
                .collect();
            assert_eq!(got, routes);
        }
    }

    #[test]
    fn template_errors() {
        let e = render_template("{{range .PodCIDRRanges}}", &cidrs("10.0.0.0/8")).unwrap_err();
        assert!(e.to_string().starts_with("template <text>: parse: "), "{e}");
        // As in Go, an unknown field is an error, not "<no value>" in the output.
        let e = render_template("{{.PodCidr}}", &cidrs("10.0.0.0/8")).unwrap_err();
        assert!(e.to_string().contains("execute: no field PodCidr"), "{e}");
    }

    #[test]
    fn invalid_render_is_not_written_and_old_output_is_untouched() {
        let d = tempfile::tempdir().unwrap();
        let template = d.path().join("cni.template");
        let output = d.path().join("10-containerd-net.conflist");
        fs::write(&template, CONTAINERD_TEST_TEMPLATE).unwrap();
        fs::write(&output, "previous content").unwrap();
        let e = render_config(&template, &cidrs("10.0.0.0/24"), &output).unwrap_err();
        assert!(matches!(e, ConfigError::Rendered { .. }), "{e}");
        assert!(e.to_string().contains("invalid JSON"), "{e}");
        assert_eq!(fs::read_to_string(&output).unwrap(), "previous content");
        // No temp file left behind.
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 2);

        // Valid JSON but our network is invalid: also not written.
        fs::write(&template, OUR_TEMPLATE.replace("1460", "9")).unwrap();
        let e = render_config(&template, &cidrs("10.0.0.0/24"), &output).unwrap_err();
        assert!(
            e.to_string()
                .contains("plugins[0].mtu: must be between 68 and 65535, got 9"),
            "{e}"
        );
        assert_eq!(fs::read_to_string(&output).unwrap(), "previous content");
    }

    #[test]
    fn render_config_writes_then_reports_unchanged() {
        let d = tempfile::tempdir().unwrap();
        let template = d.path().join("cni.template");
        let output = d.path().join("net.d").join("10-pod.conflist");
        fs::create_dir(d.path().join("net.d")).unwrap();
        fs::write(&template, OUR_TEMPLATE).unwrap();
        let nets = cidrs("10.244.1.0/24");
        let first = render_config(&template, &nets, &output).unwrap();
        assert!(matches!(first, RenderOutcome::Written { ours: Some(_) }));
        let text = fs::read_to_string(&output).unwrap();
        assert_eq!(text, render_template(OUR_TEMPLATE, &nets).unwrap());
        let second = render_config(&template, &nets, &output).unwrap();
        assert!(matches!(second, RenderOutcome::Unchanged { ours: Some(_) }));
        let third = render_config(&template, &cidrs("10.244.2.0/24"), &output).unwrap();
        assert!(matches!(third, RenderOutcome::Written { .. }));
        assert!(
            fs::read_to_string(&output)
                .unwrap()
                .contains("10.244.2.0/24")
        );
    }
}
