//! The plugin's network config model and its validation.
//!
//! A network is either a conflist
//! `{"cniVersion","name","plugins":[{"type":"provisioner","mtu":1460,"ipam":{..},"socket":".."}, ..]}`
//! or a single plugin config `{"cniVersion","name","type":"provisioner",..}` (`.conf`/`.json`).
//! Runtimes decide which shape a file has by its extension (libcni: `.conflist` is a list,
//! anything else a single config), and so do we.
//!
//! Only networks with a `provisioner` plugin are validated in depth; other networks are only
//! checked for the structure a runtime needs (a `type`, or a non-empty `plugins` list of objects
//! with a `type`). Errors name the file and the field as written: `plugins[0].mtu`.

use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::ConfigError;
use crate::json_path;

/// The CNI plugin type that selects this project.
pub const PLUGIN_TYPE: &str = "provisioner";

/// The MTU values accepted (68 is the IPv4 minimum, 65535 the largest a link takes).
pub const MTU_RANGE: RangeInclusive<u32> = 68..=65535;

/// Our plugin's configuration, from the network that holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkConfig {
    /// The network name (`name`), shared by all plugins of a conflist.
    pub name: String,
    /// The network's `cniVersion`.
    pub cni_version: String,
    /// `mtu` of the sandbox interface; `None` leaves it to the dataplane's default.
    pub mtu: Option<u32>,
    /// The `ipam` object in host-local shape (`subnet` or `ranges`, `routes`, ...); it is parsed
    /// by `crate::ipam`, here it is only checked to be an object with `subnet` or `ranges`.
    pub ipam: Value,
    /// `socket`: the daemon's API socket the plugin mode talks to; `None` means the default.
    pub socket: Option<PathBuf>,
    /// Our plugin object exactly as written in the file (as a runtime passes it on stdin, before
    /// it adds `name`, `cniVersion` and runtime keys).
    pub raw_plugin: Value,
}

/// How a runtime reads a config file, chosen by its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// `.conf` or `.json`: one plugin config.
    Conf,
    /// `.conflist`: a network with a list of plugins.
    ConfList,
}

impl FileKind {
    /// The kind of a file a runtime would load, or `None` if its extension is not one of
    /// `.conf`, `.conflist`, `.json` (libcni ignores such files).
    #[must_use]
    pub fn of(path: &Path) -> Option<Self> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("conf" | "json") => Some(Self::Conf),
            Some("conflist") => Some(Self::ConfList),
            _ => None,
        }
    }
}

/// One network config file as a runtime sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkFile {
    /// The network name, if the file has one.
    pub name: Option<String>,
    /// The `type` of every plugin, in order.
    pub plugin_types: Vec<String>,
    /// Our plugin's config and its index in `plugins` (`None` for a single `.conf`),
    /// if the network has a `provisioner` plugin.
    pub ours: Option<(Option<usize>, NetworkConfig)>,
}

impl NetworkFile {
    /// Whether every plugin of this network is `loopback` (a runtime reports such a network
    /// ready, and then never gives a sandbox any network: the motivating failure).
    #[must_use]
    pub fn is_loopback_only(&self) -> bool {
        !self.plugin_types.is_empty() && self.plugin_types.iter().all(|t| t == "loopback")
    }
}

/// What a runtime reads of a `.conflist`, whoever's network it is: its name and its plugins.
/// Other keys, and other plugins' fields, are not ours to judge.
#[derive(Deserialize)]
struct ConfListView {
    #[serde(default, deserialize_with = "string_or_none")]
    name: Option<String>,
    #[serde(deserialize_with = "json_path::objects")]
    plugins: Vec<PluginView>,
}

/// What a runtime reads of a `.conf`: one plugin, at the top level.
#[derive(Deserialize)]
struct ConfView {
    #[serde(default, deserialize_with = "string_or_none")]
    name: Option<String>,
    #[serde(rename = "type", default, deserialize_with = "string_or_none")]
    plugin_type: Option<String>,
    /// Only whether it is there: a list in a `.conf` is a misnamed `.conflist`.
    #[serde(default)]
    plugins: Option<serde::de::IgnoredAny>,
}

/// One plugin object as a runtime reads it.
#[derive(Deserialize)]
struct PluginView {
    #[serde(rename = "type", default, deserialize_with = "string_or_none")]
    plugin_type: Option<String>,
}

/// The network keys our plugin's config takes from the top level of its file.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NetworkKeys {
    name: String,
    cni_version: String,
}

/// Our plugin's own keys (in its object of `plugins`, or at the top level of a `.conf`).
#[derive(Deserialize)]
struct PluginKeys {
    #[serde(default, deserialize_with = "mtu")]
    mtu: Option<u32>,
    #[serde(deserialize_with = "host_local_ipam")]
    ipam: Value,
    #[serde(default, deserialize_with = "absolute_path")]
    socket: Option<PathBuf>,
}

/// Parses and, if it is ours, validates one network config file's content.
///
/// # Errors
/// [`ConfigError::Json`] if it is not JSON, [`ConfigError::NotANetwork`] if a runtime would not
/// load it, [`ConfigError::Invalid`] if it has a `provisioner` plugin with a bad field.
pub fn parse_network(
    path: &Path,
    kind: FileKind,
    bytes: &[u8],
) -> Result<NetworkFile, ConfigError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|source| ConfigError::Json {
        path: path.to_owned(),
        source,
    })?;
    let (name, plugins) =
        runtime_view(kind, &value).map_err(|reason| ConfigError::NotANetwork {
            path: path.to_owned(),
            reason,
        })?;

    let mut ours = None;
    for (i, _) in plugins.iter().filter(|(_, t)| t == PLUGIN_TYPE) {
        if let Some((first, _)) = &ours {
            return Err(ConfigError::invalid(
                path,
                field(*i, "type"),
                format!(
                    "a second {PLUGIN_TYPE} plugin in one network (the first is {})",
                    field(*first, "type")
                ),
            ));
        }
        let plugin = match *i {
            Some(i) => &value["plugins"][i],
            None => &value,
        };
        ours = Some((*i, validate_ours(path, &value, *i, plugin)?));
    }

    Ok(NetworkFile {
        name,
        plugin_types: plugins.into_iter().map(|(_, t)| t).collect(),
        ours,
    })
}

/// Each plugin's index in `plugins` (`None` in a `.conf`) and its `type`.
type PluginTypes = Vec<(Option<usize>, String)>;

/// The network's name and its plugins' types (with their index in `plugins`, `None` for a
/// `.conf`) as a runtime reads them, or why a runtime would not load the file.
fn runtime_view(kind: FileKind, value: &Value) -> Result<(Option<String>, PluginTypes), String> {
    let (name, plugins) = match kind {
        FileKind::ConfList => {
            let view: ConfListView = json_path::from_object(value).map_err(|e| e.to_string())?;
            if view.plugins.is_empty() {
                return Err("\"plugins\" is empty".to_owned());
            }
            let plugins = view.plugins.into_iter().enumerate();
            let plugins = plugins.map(|(i, p)| (Some(i), p.plugin_type)).collect();
            (view.name, plugins)
        }
        FileKind::Conf => {
            let view: ConfView = json_path::from_object(value).map_err(|e| e.to_string())?;
            if view.plugin_type.is_none() && view.plugins.is_some() {
                return Err(
                    "has \"plugins\" but no \"type\": a list must be named .conflist".to_owned(),
                );
            }
            (view.name, vec![(None, view.plugin_type)])
        }
    };
    let plugins = plugins
        .into_iter()
        .map(|(i, t)| match t {
            Some(t) if !t.is_empty() => Ok((i, t)),
            _ => Err(format!("{}: no plugin \"type\"", field(i, "type"))),
        })
        .collect::<Result<_, _>>()?;
    Ok((name, plugins))
}

/// The field path as written in the file: `plugins[0].mtu` in a conflist, `mtu` in a `.conf`.
fn field(index: Option<usize>, name: &str) -> String {
    match index {
        Some(i) => format!("plugins[{i}].{name}"),
        None => name.to_owned(),
    }
}

fn validate_ours(
    path: &Path,
    top: &Value,
    index: Option<usize>,
    plugin: &Value,
) -> Result<NetworkConfig, ConfigError> {
    let invalid = |field: String, reason: String| ConfigError::invalid(path, field, reason);
    let network: NetworkKeys =
        json_path::from_object(top).map_err(|e| invalid(e.path, e.reason))?;
    validate_name(&network.name).map_err(|r| invalid("name".to_owned(), r))?;
    validate_version(&network.cni_version).map_err(|r| invalid("cniVersion".to_owned(), r))?;
    let keys: PluginKeys =
        json_path::from_object(plugin).map_err(|e| invalid(field(index, &e.path), e.reason))?;
    super::feasible::check(&keys.ipam, keys.mtu)
        .map_err(|e| invalid(field(index, &e.field), e.reason))?;
    Ok(NetworkConfig {
        name: network.name,
        cni_version: network.cni_version,
        mtu: keys.mtu,
        ipam: keys.ipam,
        socket: keys.socket,
        raw_plugin: plugin.clone(),
    })
}

/// A string, or `None` for anything else: a runtime's reading of another plugin's keys.
fn string_or_none<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => Some(s),
        _ => None,
    })
}

/// `mtu`: absent, `null`, or an integer in [`MTU_RANGE`].
fn mtu<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    let Some(v) = Option::<Value>::deserialize(d)? else {
        return Ok(None);
    };
    let n = v
        .as_u64()
        .ok_or_else(|| D::Error::custom(format!("must be an integer, got {v}")))?;
    match u32::try_from(n) {
        Ok(n) if MTU_RANGE.contains(&n) => Ok(Some(n)),
        _ => Err(D::Error::custom(format!(
            "must be between {} and {}, got {n}",
            MTU_RANGE.start(),
            MTU_RANGE.end()
        ))),
    }
}

/// `ipam`: an object in host-local shape (`subnet` or `ranges`); `crate::ipam` parses it.
fn host_local_ipam<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
    match Value::deserialize(d)? {
        Value::Object(o) => {
            let has = |k: &str| o.get(k).is_some_and(|v| !v.is_null());
            if !has("subnet") && !has("ranges") {
                return Err(D::Error::custom(
                    "must have \"subnet\" or \"ranges\" (host-local shape)",
                ));
            }
            Ok(Value::Object(o))
        }
        other => Err(D::Error::custom(format!("must be an object, got {other}"))),
    }
}

/// `socket`: absent, `null`, or an absolute path.
fn absolute_path<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
    let Some(s) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    let p = PathBuf::from(&s);
    if !p.is_absolute() {
        return Err(D::Error::custom(format!(
            "must be an absolute path, got {s:?}"
        )));
    }
    Ok(Some(p))
}

/// CNI spec: a network name starts with an alphanumeric character, followed by alphanumerics,
/// `_`, `.` or `-`.
fn validate_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    match chars.next() {
        None => return Err("must not be empty".to_owned()),
        Some(c) if !c.is_ascii_alphanumeric() => {
            return Err(format!("must start with a letter or digit, got {name:?}"));
        }
        Some(_) => {}
    }
    if let Some(c) = chars.find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))) {
        return Err(format!(
            "may hold only letters, digits, '_', '.' and '-', got {c:?} in {name:?}"
        ));
    }
    Ok(())
}

/// A semantic version `MAJOR.MINOR.PATCH`; which versions are supported is the `cni` module's call.
fn validate_version(v: &str) -> Result<(), String> {
    let parts: Vec<&str> = v.split('.').collect();
    if parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    {
        Ok(())
    } else {
        Err(format!("must be a version like \"1.0.0\", got {v:?}"))
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests fail loudly on unexpected input")]
mod tests {
    use super::*;
    use serde_json::json;

    const P: &str = "/etc/cni/net.d/10-pod.conflist";

    fn conflist(plugin: &Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "cniVersion": "1.0.0",
            "name": "pod-network",
            "plugins": [plugin, {"type": "portmap", "capabilities": {"portMappings": true}}]
        }))
        .unwrap()
    }

    fn good_plugin() -> Value {
        json!({
            "type": "provisioner",
            "mtu": 1460,
            "socket": "/run/provisioner/provisioner.sock",
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.1.0/24"}]]}
        })
    }

    fn err(bytes: &[u8], kind: FileKind) -> String {
        parse_network(Path::new(P), kind, bytes)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn parses_a_conflist() {
        let f = parse_network(Path::new(P), FileKind::ConfList, &conflist(&good_plugin())).unwrap();
        assert_eq!(f.plugin_types, ["provisioner", "portmap"]);
        let (idx, c) = f.ours.unwrap();
        assert_eq!(idx, Some(0));
        assert_eq!(c.name, "pod-network");
        assert_eq!(c.cni_version, "1.0.0");
        assert_eq!(c.mtu, Some(1460));
        assert_eq!(
            c.socket.as_deref(),
            Some(Path::new("/run/provisioner/provisioner.sock"))
        );
        assert_eq!(c.ipam["type"], "host-local");
        assert_eq!(c.raw_plugin, good_plugin());
    }

    #[test]
    fn parses_a_single_conf() {
        let bytes = br#"{"cniVersion":"0.4.0","name":"pod","type":"provisioner",
            "ipam":{"type":"host-local","subnet":"10.244.1.0/24"}}"#;
        let f = parse_network(Path::new("/x/10.conf"), FileKind::Conf, bytes).unwrap();
        let (idx, c) = f.ours.unwrap();
        assert_eq!(idx, None);
        assert_eq!(c.mtu, None);
        assert_eq!(c.socket, None);
    }

    #[test]
    fn mtu_out_of_range_names_file_and_field() {
        let mut p = good_plugin();
        p["mtu"] = json!(9);
        assert_eq!(
            err(&conflist(&p), FileKind::ConfList),
            "/etc/cni/net.d/10-pod.conflist: plugins[0].mtu: must be between 68 and 65535, got 9"
        );
        p["mtu"] = json!("1500");
        assert!(
            err(&conflist(&p), FileKind::ConfList).contains("plugins[0].mtu: must be an integer")
        );
        p["mtu"] = json!(70000);
        assert!(err(&conflist(&p), FileKind::ConfList).ends_with("got 70000"));
    }

    #[test]
    fn single_conf_fields_have_no_plugins_prefix() {
        let bytes = br#"{"cniVersion":"1.0.0","name":"pod","type":"provisioner","mtu":0,
            "ipam":{"subnet":"10.244.1.0/24"}}"#;
        assert_eq!(
            err(bytes, FileKind::Conf),
            "/etc/cni/net.d/10-pod.conflist: mtu: must be between 68 and 65535, got 0"
        );
    }

    #[test]
    fn ipam_must_be_host_local_shaped() {
        let mut p = good_plugin();
        p["ipam"] = json!({"type": "host-local"});
        assert!(
            err(&conflist(&p), FileKind::ConfList)
                .contains("plugins[0].ipam: must have \"subnet\" or \"ranges\"")
        );
        p["ipam"] = json!("10.0.0.0/8");
        assert!(
            err(&conflist(&p), FileKind::ConfList).contains("plugins[0].ipam: must be an object")
        );
        p.as_object_mut().unwrap().remove("ipam");
        assert!(err(&conflist(&p), FileKind::ConfList).contains("plugins[0].ipam: is required"));
    }

    #[test]
    fn socket_must_be_absolute() {
        let mut p = good_plugin();
        p["socket"] = json!("run/x.sock");
        assert!(
            err(&conflist(&p), FileKind::ConfList)
                .contains("plugins[0].socket: must be an absolute path")
        );
    }

    #[test]
    fn name_and_version_are_checked() {
        let bytes = br#"{"cniVersion":"1.0","name":"pod","type":"provisioner","ipam":{"subnet":"10.0.0.0/24"}}"#;
        assert!(err(bytes, FileKind::Conf).contains(": cniVersion: must be a version"));
        let bytes = br#"{"cniVersion":"1.0.0","name":"-pod","type":"provisioner","ipam":{"subnet":"10.0.0.0/24"}}"#;
        assert!(err(bytes, FileKind::Conf).contains(": name: must start with a letter or digit"));
        let bytes =
            br#"{"cniVersion":"1.0.0","type":"provisioner","ipam":{"subnet":"10.0.0.0/24"}}"#;
        assert!(err(bytes, FileKind::Conf).contains(": name: is required"));
    }

    #[test]
    fn wrong_types_name_the_field_and_what_was_found() {
        let mut p = good_plugin();
        p["socket"] = json!(7);
        assert_eq!(
            err(&conflist(&p), FileKind::ConfList),
            "/etc/cni/net.d/10-pod.conflist: plugins[0].socket: invalid type: integer `7`, \
             expected a string"
        );
        let bytes = br#"{"cniVersion":"1.0.0","name":7,"type":"provisioner","ipam":{"subnet":"10.0.0.0/24"}}"#;
        assert!(
            err(bytes, FileKind::Conf)
                .ends_with(": name: invalid type: integer `7`, expected a string")
        );
        // Another network's odd name is not ours to judge.
        let f = parse_network(
            Path::new("/x/10.conf"),
            FileKind::Conf,
            br#"{"name":7,"type":"bridge"}"#,
        )
        .unwrap();
        assert_eq!(f.name, None);
    }

    #[test]
    fn two_provisioner_plugins_are_refused() {
        let bytes = serde_json::to_vec(&json!({
            "cniVersion": "1.0.0", "name": "n", "plugins": [good_plugin(), good_plugin()]
        }))
        .unwrap();
        assert!(
            err(&bytes, FileKind::ConfList)
                .contains("plugins[1].type: a second provisioner plugin")
        );
    }

    #[test]
    fn other_networks_are_checked_only_for_structure() {
        let f = parse_network(
            Path::new("/x/99-loopback.conf"),
            FileKind::Conf,
            br#"{"cniVersion":"0.3.1","name":"cni-loopback","type":"loopback"}"#,
        )
        .unwrap();
        assert!(f.is_loopback_only());
        assert!(f.ours.is_none());
        // Other plugins' fields are not ours to judge.
        let f = parse_network(
            Path::new("/x/10.conflist"),
            FileKind::ConfList,
            br#"{"name":"x","plugins":[{"type":"bridge","mtu":9}]}"#,
        )
        .unwrap();
        assert_eq!(f.plugin_types, ["bridge"]);
    }

    #[test]
    fn structure_errors() {
        assert!(err(b"{\"name\":\"x\"", FileKind::ConfList).contains("invalid JSON"));
        assert!(err(b"", FileKind::ConfList).contains("invalid JSON"));
        assert!(
            err(br#"{"name":"x","plugins":[]}"#, FileKind::ConfList)
                .contains("\"plugins\" is empty")
        );
        assert!(err(br#"{"name":"x"}"#, FileKind::ConfList).ends_with("plugins: is required"));
        assert!(
            err(br#"{"name":"x","plugins":{}}"#, FileKind::ConfList)
                .contains("plugins: invalid type: map, expected a sequence")
        );
        assert!(
            err(br#"{"name":"x","plugins":[7]}"#, FileKind::ConfList)
                .contains("plugins[0]: invalid type: integer `7`, expected an object")
        );
        assert!(
            err(
                br#"{"name":"x","plugins":[{"type":"provisioner"}]}"#,
                FileKind::Conf
            )
            .contains("a list must be named .conflist")
        );
        assert!(
            err(br#"{"name":"x","plugins":[{"mtu":1}]}"#, FileKind::ConfList)
                .contains("plugins[0].type: no plugin \"type\"")
        );
        assert!(
            err(b"[1]", FileKind::Conf)
                .ends_with("not a CNI network config: invalid type: sequence, expected an object")
        );
    }

    #[test]
    fn file_kind_by_extension() {
        assert_eq!(FileKind::of(Path::new("a.conf")), Some(FileKind::Conf));
        assert_eq!(FileKind::of(Path::new("a.json")), Some(FileKind::Conf));
        assert_eq!(
            FileKind::of(Path::new("a.conflist")),
            Some(FileKind::ConfList)
        );
        assert_eq!(FileKind::of(Path::new(".a.conflist.1.tmp")), None);
        assert_eq!(FileKind::of(Path::new("conf")), None);
    }

    #[test]
    fn a_version_has_three_numeric_parts() {
        for bad in ["1.x.0", "1..0", "1.0.0.0", "v1.0.0"] {
            let bytes = format!(
                r#"{{"cniVersion":"{bad}","name":"pod","type":"provisioner","ipam":{{"subnet":"10.0.0.0/24"}}}}"#
            );
            assert!(
                err(bytes.as_bytes(), FileKind::Conf).contains(": cniVersion: must be a version"),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_single_conf_is_read_by_its_type_as_runtimes_do() {
        // A .conf with a `type` is one plugin even if it also has a `plugins` key.
        let f = parse_network(
            Path::new("/x/10.conf"),
            FileKind::Conf,
            br#"{"name":"x","type":"loopback","plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        assert_eq!(f.plugin_types, ["loopback"]);
        // Without either, the reason is the missing type, not a misnamed list.
        let e = err(br#"{"name":"x"}"#, FileKind::Conf);
        assert!(e.ends_with("type: no plugin \"type\""), "{e}");
        // An empty type names no plugin a runtime could run.
        let e = err(
            br#"{"name":"x","plugins":[{"type":""}]}"#,
            FileKind::ConfList,
        );
        assert!(e.contains("plugins[0].type: no plugin \"type\""), "{e}");
    }
}
