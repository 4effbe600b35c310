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
//! validate. Only then is it written (temp file in the same dir, write, fsync, rename, fsync
//! the dir), so a runtime watching the dir never sees a partial or invalid file, and a
//! rejected render leaves the previous file untouched.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use ipnetwork::IpNetwork;

use super::ConfigError;
use super::network::{FileKind, NetworkConfig, parse_network};

/// IPv4 default route, as containerd renders it into `.Routes`.
pub const ZERO_CIDR_V4: &str = "0.0.0.0/0";
/// IPv6 default route, as containerd renders it into `.Routes`.
pub const ZERO_CIDR_V6: &str = "::/0";

/// Parses a `--pod-cidr` value: CIDRs separated by commas (spaces around them allowed, as
/// containerd trims them). Each must have a prefix length and no host bits set.
///
/// # Errors
/// [`ConfigError::PodCidr`] naming the first bad CIDR.
pub fn parse_pod_cidrs(value: &str) -> Result<Vec<IpNetwork>, ConfigError> {
    let cidrs = value
        .split(',')
        .map(|s| parse_pod_cidr(s.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    validate_pod_cidrs(&cidrs)?;
    Ok(cidrs)
}

fn parse_pod_cidr(s: &str) -> Result<IpNetwork, ConfigError> {
    let bad = |reason: &str| ConfigError::PodCidr {
        value: s.to_owned(),
        reason: reason.to_owned(),
    };
    if s.is_empty() {
        return Err(bad("empty"));
    }
    if !s.contains('/') {
        return Err(bad("no prefix length (expected e.g. 10.244.1.0/24)"));
    }
    let net = IpNetwork::from_str(s).map_err(|e| bad(&format!("not a CIDR: {e}")))?;
    Ok(net)
}

/// Checks pod CIDRs already parsed: at least one, none with host bits set, no duplicates.
///
/// # Errors
/// [`ConfigError::PodCidr`] naming the bad CIDR.
pub fn validate_pod_cidrs(cidrs: &[IpNetwork]) -> Result<(), ConfigError> {
    if cidrs.is_empty() {
        return Err(ConfigError::PodCidr {
            value: String::new(),
            reason: "at least one pod CIDR is needed".to_owned(),
        });
    }
    for (i, net) in cidrs.iter().enumerate() {
        if net.ip() != net.network() {
            return Err(ConfigError::PodCidr {
                value: net.to_string(),
                reason: format!(
                    "host bits set (the network is {}/{})",
                    net.network(),
                    net.prefix()
                ),
            });
        }
        if cidrs[..i].contains(net) {
            return Err(ConfigError::PodCidr {
                value: net.to_string(),
                reason: "given twice".to_owned(),
            });
        }
    }
    Ok(())
}

/// The routes containerd passes as `.Routes`: one default route per address family present.
#[must_use]
pub fn routes_for(cidrs: &[IpNetwork]) -> Vec<String> {
    let mut routes = Vec::new();
    if cidrs.iter().any(IpNetwork::is_ipv4) {
        routes.push(ZERO_CIDR_V4.to_owned());
    }
    if cidrs.iter().any(IpNetwork::is_ipv6) {
        routes.push(ZERO_CIDR_V6.to_owned());
    }
    routes
}

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

/// The first thing gtmpl cannot lex, with its line. gtmpl's lexer steps back one byte where it
/// means one character, also past the end of the text: a multi-byte character inside an action
/// (outside a quoted string, raw string or character constant), or as the last non-space
/// character before a `{{- ` trim marker, makes its lexer thread panic (the parse then fails with
/// a meaningless error); an action still open at the end of the text (`{{ .PodCIDR `) makes it
/// loop forever and the render hang. Go rejects all of these too, but for a multi-byte
/// character in a variable name. Literals are followed as gtmpl lexes them (a backslash always
/// escapes the next character; a newline ends the lexing with an error).
fn gtmpl_unlexable(text: &str) -> Option<(usize, String)> {
    let line = |at: usize| text[..at].matches('\n').count() + 1;
    let found = |at: usize, c: char| {
        Some((
            line(at),
            format!(
                "non-ASCII character {c:?} (U+{:04X}) in an action or right before `{{{{- `: \
                 only quoted strings, comments and text may hold one",
                u32::from(c)
            ),
        ))
    };
    let mut at = 0;
    while let Some(open) = text[at..].find("{{") {
        let before = text[at..at + open].trim_end_matches(char::is_whitespace);
        let rest = &text[at + open + 2..];
        if rest.starts_with("- ")
            && let Some(c) = before.chars().next_back().filter(|c| !c.is_ascii())
        {
            return found(at + before.len() - c.len_utf8(), c);
        }
        let action = at + open;
        at += open + 2;
        let body = rest.strip_prefix("- ").unwrap_or(rest);
        if body.starts_with("/*") {
            let comment = at + (rest.len() - body.len()) + 2;
            at = comment + text[comment..].find("*/")? + 2;
            continue;
        }
        let mut quote = None;
        let mut opened = 0;
        let mut escaped = false;
        let mut closed = false;
        for (i, c) in text[at..].char_indices() {
            match quote {
                Some(q) if c == '\\' && q != '`' => escaped = true,
                Some(q) if c == '\n' && q != '`' => return None,
                Some(q) if c == q && !escaped => {
                    quote = None;
                    if q != '`'
                        && let Some(what) = bad_escape(&text[opened + 1..at + i])
                    {
                        return Some((line(opened), what));
                    }
                }
                Some(_) => escaped = false,
                None if text[at + i..].starts_with("}}") => {
                    at += i + 2;
                    closed = true;
                    break;
                }
                None if matches!(c, '"' | '`' | '\'') => {
                    quote = Some(c);
                    opened = at + i;
                }
                None if !c.is_ascii() => return found(at + i, c),
                None => {}
            }
        }
        if !closed {
            return Some((line(action), "unclosed action".to_owned()));
        }
    }
    None
}

/// An escape in a quoted string or character constant that gtmpl's unquoting cannot take: it
/// loops forever on `\u` or `\x` without their hex digits, reads the four or two bytes after
/// one of them whatever they are (cutting a multi-byte character: a panic), and slices two
/// bytes after any backslash.
fn bad_escape(raw: &str) -> Option<String> {
    let mut chars = raw.chars();
    let mut hex_escapes = false;
    while let Some(c) = chars.next() {
        if c != '\\' {
            continue;
        }
        let digits = match chars.next() {
            Some('b' | 'f' | 'n' | 'r' | 't' | '\'' | '"' | '\\') => 0,
            Some('x') => 2,
            Some('u') => 4,
            Some('U') => 8,
            other => {
                return Some(format!(
                    "escape \\{} in a quoted string is not one of \\b \\f \\n \\r \\t \\' \\\" \\\\ \\x \\u \\U",
                    other.map(String::from).unwrap_or_default()
                ));
            }
        };
        hex_escapes |= digits > 0;
        if !(0..digits).all(|_| chars.next().is_some_and(|c| c.is_ascii_hexdigit())) {
            return Some(format!(
                "escape in quoted string {raw:?} lacks its {digits} hex digits"
            ));
        }
    }
    (hex_escapes && !raw.is_ascii())
        .then(|| format!("quoted string {raw:?} with a \\x or \\u escape must be ASCII"))
}

/// `printf` as Go's where gtmpl's differs: `%%` is a literal `%` (gtmpl prints `%%`), and a
/// plain `%q` of a string quotes it as `strconv.Quote` does (gtmpl leaves the quotes out), so
/// `"subnet": {{printf "%q" .PodCIDR}}` renders the same JSON as with containerd. Each other
/// verb is formatted by gtmpl, one at a time; formats this cannot split (see [`format_pieces`])
/// or with too few or too many values go to gtmpl as they are.
fn go_printf(args: &[gtmpl::Value]) -> Result<gtmpl::Value, gtmpl::FuncError> {
    if let Some(gtmpl::Value::String(format)) = args.first()
        && let Some(n) = oversized_width(format)
    {
        return Err(gtmpl::FuncError::Generic(format!(
            "printf: width or precision {n} in {format:?} is larger than {}",
            u16::MAX
        )));
    }
    let Some((gtmpl::Value::String(format), values)) = args.split_first() else {
        return gtmpl::funcs::printf(args);
    };
    let Some(pieces) = format_pieces(format) else {
        return gtmpl::funcs::printf(args);
    };
    let verbs = pieces
        .iter()
        .filter(|p| matches!(p, FormatPiece::Verb(_)))
        .count();
    if verbs != values.len() {
        return gtmpl::funcs::printf(args);
    }
    let mut out = String::new();
    let mut values = values.iter();
    for piece in pieces {
        match piece {
            FormatPiece::Text(text) => out.push_str(&text),
            FormatPiece::Verb(verb) => {
                let Some(value) = values.next() else {
                    return gtmpl::funcs::printf(args);
                };
                match value {
                    gtmpl::Value::String(text) if verb == "%q" => out.push_str(&go_quote(text)),
                    _ => {
                        let one =
                            gtmpl::funcs::printf(&[gtmpl::Value::String(verb), value.clone()])?;
                        out.push_str(&one.to_string());
                    }
                }
            }
        }
    }
    Ok(gtmpl::Value::String(out))
}

/// A width or precision in a printf format that gtmpl would hand to Rust's formatter, which
/// panics above `u16::MAX` (found by the `template` fuzz target: `%2010201s`).
fn oversized_width(format: &str) -> Option<u64> {
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' || chars.next_if_eq(&'%').is_some() {
            continue;
        }
        let mut number = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_ascii_alphabetic() && *c != '%') {
            if c.is_ascii_digit() {
                number.push(c);
                continue;
            }
            if let Some(n) = too_large(&number) {
                return Some(n);
            }
            number.clear();
        }
        if let Some(n) = too_large(&number) {
            return Some(n);
        }
    }
    None
}

fn too_large(digits: &str) -> Option<u64> {
    let n = digits.parse::<u64>().unwrap_or(u64::MAX);
    (!digits.is_empty() && n > u64::from(u16::MAX)).then_some(n)
}

#[derive(Debug, PartialEq)]
enum FormatPiece {
    /// Literal text (`%%` already turned into `%`).
    Text(String),
    /// One verb with its flags, width and precision, e.g. `%-8.3s`.
    Verb(String),
}

/// Splits a printf format into literal text and verbs; `None` when it is not one this can
/// split (a `*` width or precision, an explicit argument index `[n]`, a `%` without a verb).
fn format_pieces(format: &str) -> Option<Vec<FormatPiece>> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            text.push(c);
            continue;
        }
        if chars.next_if_eq(&'%').is_some() {
            text.push('%');
            continue;
        }
        let mut verb = String::from("%");
        loop {
            let next = chars.next()?;
            if next == '*' || next == '[' {
                return None;
            }
            verb.push(next);
            if next.is_ascii_alphabetic() {
                break;
            }
        }
        if !text.is_empty() {
            pieces.push(FormatPiece::Text(std::mem::take(&mut text)));
        }
        pieces.push(FormatPiece::Verb(verb));
    }
    if !text.is_empty() {
        pieces.push(FormatPiece::Text(text));
    }
    Some(pieces)
}

/// Go's `strconv.Quote`: double quotes, with `"`, `\` and control characters escaped as Go
/// escapes them (other characters Go deems unprintable, e.g. U+00A0, are kept as they are).
fn go_quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if u32::from(c) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", u32::from(c)));
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
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

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The directory `path` is in (where its temporary file goes, and what is synced after the
/// rename): `.` for a bare file name.
fn directory_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// Replaces `path` with `bytes` atomically, as a file of `mode`: a temp file in the same dir is
/// written with that mode (set before the rename, whatever the umask), fsynced and renamed over
/// `path`, then the dir is fsynced. Readers see the old content or the new, never a part nor a
/// file without its mode; on error the temp file is removed and `path` is untouched.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: no file name", path.display()),
        )
    })?;
    let dir = directory_of(path);
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(
        ".{}.{}.{n}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        fs::File::open(&dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests fail loudly on unexpected input")]
mod tests {
    use super::*;

    /// containerd's GCE-style template (containerd's `conf_template` for GKE/GCE nodes), verbatim;
    /// the containerd test renders it with containerd too.
    const GCE_TEMPLATE: &str = include_str!("../../tests/fixtures/containerd-templates/gce.tmpl");

    /// containerd's documented single-stack template for the reference plugins, verbatim.
    const REFERENCE_TEMPLATE: &str =
        include_str!("../../tests/fixtures/containerd-templates/reference.tmpl");

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

    fn cidrs(s: &str) -> Vec<IpNetwork> {
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
    fn bad_pod_cidrs_are_named() {
        for (input, want) in [
            ("10.244.1.0/33", "pod CIDR \"10.244.1.0/33\": not a CIDR"),
            ("10.244.1.0/24,bogus/8", "pod CIDR \"bogus/8\": not a CIDR"),
            ("10.244.1.0", "pod CIDR \"10.244.1.0\": no prefix length"),
            ("10.244.1.0/24,", "pod CIDR \"\": empty"),
            (
                "10.244.1.5/24",
                "pod CIDR \"10.244.1.5/24\": host bits set (the network is 10.244.1.0/24)",
            ),
            (
                "10.244.1.0/24, 10.244.1.0/24",
                "pod CIDR \"10.244.1.0/24\": given twice",
            ),
        ] {
            let e = parse_pod_cidrs(input).unwrap_err().to_string();
            assert!(e.starts_with(want), "{input}: {e}");
        }
        assert!(render_template(GCE_TEMPLATE, &[]).is_err());
    }

    #[test]
    fn widths_above_u16_max_are_found_and_nothing_else() {
        assert_eq!(oversized_width("%65535d"), None);
        assert_eq!(oversized_width("%65536d"), Some(65_536));
        assert_eq!(oversized_width("%-8.70000s"), Some(70_000));
        // Digits that are not a width: after a literal `%%`, after a verb, in plain text.
        assert_eq!(oversized_width("%%70000d"), None);
        assert_eq!(oversized_width("%d 70000"), None);
        assert_eq!(oversized_width("width 70000 px"), None);
    }

    #[test]
    fn the_temporary_file_goes_in_the_directory_of_the_output() {
        assert_eq!(
            directory_of(Path::new("/etc/cni/net.d/10-pod.conflist")),
            Path::new("/etc/cni/net.d")
        );
        assert_eq!(directory_of(Path::new("10-pod.conflist")), Path::new("."));
    }

    #[test]
    fn printf_q_quotes_like_go() {
        let out = render_template(
            r#"{{printf "%q" .PodCIDR}} {{printf "%q|%s|%d%%" .PodCIDR .PodCIDR 7}} {{printf "%v" 1}}"#,
            &cidrs("10.244.1.0/24"),
        )
        .unwrap();
        assert_eq!(out, r#""10.244.1.0/24" "10.244.1.0/24"|10.244.1.0/24|7% 1"#);
        assert_eq!(go_quote("a\"b\\c\n\u{1}\u{7}"), r#""a\"b\\c\n\x01\a""#);
        // A space is printable; a C1 control character is escaped as Go does.
        assert_eq!(go_quote("a b\u{7f}\u{85}"), r#""a b\x7f\u0085""#);
        let out = render_template(
            r#"[{{printf "%-6s|%5.1f" "ab" 2.25}}]"#,
            &cidrs("10.0.0.0/8"),
        );
        assert_eq!(out.unwrap(), "[ab    |  2.2]");
    }

    #[test]
    fn printf_formats_are_split_into_text_and_verbs() {
        use FormatPiece::{Text, Verb};
        assert_eq!(
            format_pieces("a%%b%-8.2fc%q"),
            Some(vec![
                Text("a%b".into()),
                Verb("%-8.2f".into()),
                Text("c".into()),
                Verb("%q".into())
            ])
        );
        assert_eq!(format_pieces("100%"), None);
        assert_eq!(format_pieces("%*d"), None);
        assert_eq!(format_pieces("%[1]d"), None);
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

    #[test]
    fn write_atomically_replaces_and_leaves_no_temp() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.conf");
        write_atomically(&p, b"one", 0o644).unwrap();
        write_atomically(&p, b"two", 0o644).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
        let e =
            write_atomically(&d.path().join("missing").join("a.conf"), b"x", 0o644).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    /// gtmpl's lexer steps back one byte, not one character: a non-ASCII character inside an
    /// action (a no-break space pasted after `.PodCIDR`, a letter) or right before `{{- ` made
    /// its thread panic and the render fail with "receiving on a closed channel" (found by the
    /// `template` fuzz target).
    #[test]
    fn non_ascii_in_an_action_is_a_template_error_naming_it() {
        let nets = cidrs("10.244.1.0/24");
        for (text, line) in [
            ("{\"subnet\": \"{{.PodCIDR\u{a0}}}\"}", 1),
            ("{\n\"a\": \"{{range \u{711}, $r := .Routes}}{{end}}\"}", 2),
            ("{{\u{a0}\u{a0}.PodCIDR}}", 1),
            ("\"caf\u{e9}\n\n{{- .PodCIDR}}\"", 1),
        ] {
            let err = render_template(text, &nets).unwrap_err().to_string();
            assert!(
                err.contains(&format!("line {line}")) && err.contains("non-ASCII"),
                "{text:?}: {err}"
            );
        }
        // Inside quoted strings, comments and plain text they are fine, as in Go.
        let ok = "{{/* r\u{e9}seau */}}{\"n\u{e9}\": {{printf \"%q\" \"\u{e9}\u{a0}\"}}, \"c\": \"{{.PodCIDR}}\"}";
        assert_eq!(
            render_template(ok, &nets).unwrap(),
            "{\"n\u{e9}\": \"\u{e9}\u{a0}\", \"c\": \"10.244.1.0/24\"}"
        );
    }

    /// An action open at the end of the text made gtmpl's lexer loop forever (it steps back past
    /// the end) and the render hang (found by the `template` fuzz target).
    #[test]
    fn an_action_open_at_the_end_is_an_error_not_a_hang() {
        let nets = cidrs("10.244.1.0/24");
        for text in [
            "{\"subnet\": \"{{ .PodCIDR ",
            "{}\n{{+",
            "{}\n\n{{ 1.",
            // gtmpl's quoted string does not end at `\\"`: the action goes on to the end.
            "{{\"\\\\\"}}\" 1.",
        ] {
            let err = render_template(text, &nets).unwrap_err().to_string();
            assert!(err.contains("unclosed action"), "{text:?}: {err}");
        }
        let line = render_template("{}\n\n{{ 1.", &nets)
            .unwrap_err()
            .to_string();
        assert!(line.contains("line 3"), "{line}");
    }

    /// A printf width above `u16::MAX` made gtmpl's printf panic in the rendering thread (found
    /// by the `template` fuzz target).
    #[test]
    fn printf_with_a_huge_width_is_an_error_not_a_panic() {
        let nets = cidrs("10.244.1.0/24");
        for format in ["%2010201s", "%-1.70000s", "%d %99999999999999999999999s"] {
            let text = format!("{{{{printf \"{format}\" 12 .PodCIDR}}}}");
            let err = render_template(&text, &nets).unwrap_err().to_string();
            assert!(err.contains("larger than 65535"), "{format}: {err}");
        }
        assert_eq!(
            render_template("{{printf \"%.3s|%d%%\" .PodCIDR 7}}", &nets).unwrap(),
            "10.|7%"
        );
    }

    /// gtmpl's unquoting looped forever on `\u` without its four hex digits (found by the
    /// `template` fuzz target) and panics on a backslash before a multi-byte character.
    #[test]
    fn a_bad_escape_in_a_quoted_string_is_an_error_not_a_hang() {
        let nets = cidrs("10.244.1.0/24");
        for text in [
            "{{printf \"%s\\ub  \" .PodCIDR}}",
            "{{print \"\\x4\"}}",
            "{{print \"\\\u{e9}\"}}",
            "{{print \"\\x41a\u{e9}\"}}",
        ] {
            let err = render_template(text, &nets).unwrap_err().to_string();
            assert!(
                err.contains("line 1") && err.contains("quoted string"),
                "{text:?}: {err}"
            );
        }
        assert_eq!(
            render_template("{{print \"\\u00e9\\t\\\"\"}}", &nets).unwrap(),
            "\u{e9}\t\""
        );
    }

    #[test]
    fn a_non_ascii_character_before_a_trim_marker_is_named_on_its_line() {
        let nets = cidrs("10.244.1.0/24");
        let err = render_template("{}\n\nx\u{e9} {{- .PodCIDR}}", &nets)
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 3") && err.contains("U+00E9"), "{err}");
    }

    #[test]
    fn comments_are_skipped_exactly_to_their_end() {
        let nets = cidrs("10.244.1.0/24");
        // What follows a comment is still checked, with its line.
        for (text, line) in [
            ("{{/**/}}{{.PodCIDR\u{a0}}}", 1),
            ("{{/* a much longer comment */}}{{.PodCIDR\u{a0}}}", 1),
            ("{{/* a */}}\n{{.PodCIDR\u{a0}}}", 2),
            ("{{- /* a\nb */ -}}\n{{.PodCIDR\u{a0}}}", 3),
        ] {
            let err = render_template(text, &nets).unwrap_err().to_string();
            assert!(
                err.contains(&format!("line {line}")) && err.contains("non-ASCII"),
                "{text:?}: {err}"
            );
        }
        // Whatever a comment holds (even `{{` and a non-ASCII character) is not an action.
        for text in [
            "{{/*/ {{ caf\u{e9} */}}\"{{.PodCIDR}}\"",
            "{{- /*/ {{ caf\u{e9} */ -}} \"{{.PodCIDR}}\"",
        ] {
            assert_eq!(
                render_template(text, &nets).unwrap(),
                "\"10.244.1.0/24\"",
                "{text:?}"
            );
        }
    }

    #[test]
    fn an_escaped_quote_does_not_end_a_quoted_string() {
        let nets = cidrs("10.244.1.0/24");
        assert_eq!(
            render_template("{{print \"a\\\"\u{e9}\"}}", &nets).unwrap(),
            "a\"\u{e9}"
        );
    }

    #[test]
    fn an_action_is_still_checked_after_a_quoted_string() {
        let nets = cidrs("10.244.1.0/24");
        let err = render_template("{{print \"a\" .PodCIDR\u{a0}}}", &nets)
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 1") && err.contains("non-ASCII"), "{err}");
    }

    #[test]
    fn a_newline_in_a_quoted_string_is_the_error_reported() {
        // gtmpl's lexer stops there: what follows is not checked, the string is the error.
        let nets = cidrs("10.244.1.0/24");
        let err = render_template("{{print \"a\n\" \u{e9}}}", &nets)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unterminated quoted string"), "{err}");
    }
}
