//! The network configuration a runtime streams on stdin: the well-known envelope keys, typed,
//! plus the whole object for plugin-specific keys.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::error::CniError;
use super::version::CniVersion;
use crate::json_path;

/// GC's list key (spec 1.1.0).
pub const VALID_ATTACHMENTS_KEY: &str = "cni.dev/valid-attachments";
/// The same list under the name libcni also injects (containernetworking/cni#1101).
pub const ATTACHMENTS_KEY_ALIAS: &str = "cni.dev/attachments";

/// One still-valid attachment in a GC request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// The stdin network configuration of one plugin invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
    pub cni_version: CniVersion,
    pub name: String,
    /// `"type"`: the plugin executable's name.
    pub plugin_type: String,
    pub prev_result: Option<Value>,
    pub runtime_config: Option<Value>,
    /// GC's `cni.dev/valid-attachments` (or its alias `cni.dev/attachments`); `None` if absent.
    pub valid_attachments: Option<Vec<Attachment>>,
    /// The whole object, for plugin-specific keys.
    pub raw: Value,
}

/// The envelope as written: the keys every plugin reads.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    #[serde(deserialize_with = "required_text")]
    cni_version: String,
    #[serde(deserialize_with = "required_text")]
    name: String,
    #[serde(rename = "type", deserialize_with = "required_text")]
    plugin_type: String,
    #[serde(default, deserialize_with = "optional_object")]
    prev_result: Option<Value>,
    #[serde(default, deserialize_with = "optional_object")]
    runtime_config: Option<Value>,
    #[serde(rename = "cni.dev/valid-attachments", default)]
    valid_attachments: Option<Value>,
    /// Read only if [`VALID_ATTACHMENTS_KEY`] is absent.
    #[serde(rename = "cni.dev/attachments", default)]
    attachments_alias: Option<Value>,
}

impl NetConf {
    /// Parses and validates the envelope.
    ///
    /// Not JSON -> code 6; not an object, missing or mistyped `cniVersion` / `name` / `type`,
    /// mistyped `prevResult` / `runtimeConfig` / attachments -> code 7 naming the field (its
    /// path: `cni.dev/valid-attachments[0].ifname`); an unsupported `cniVersion` -> code 1
    /// naming it.
    pub fn parse(bytes: &[u8]) -> Result<Self, CniError> {
        let raw: Value = serde_json::from_slice(bytes)
            .map_err(|e| CniError::decode(format!("network config is not valid JSON: {e}")))?;
        let envelope: Envelope = json_path::from_object(&raw).map_err(|e| invalid(&e))?;
        let cni_version = CniVersion::parse(&envelope.cni_version)?;
        validate_network_name(&envelope.name)?;
        let valid_attachments = match (envelope.valid_attachments, envelope.attachments_alias) {
            (Some(list), _) => Some((VALID_ATTACHMENTS_KEY, list)),
            (None, Some(list)) => Some((ATTACHMENTS_KEY_ALIAS, list)),
            (None, None) => None,
        }
        .map(|(key, list)| {
            let list = json_path::from_value::<Vec<json_path::Object<Attachment>>>(&list);
            let list = list.map_err(|e| {
                invalid(&json_path::PathError {
                    path: e.path_under(key),
                    reason: e.reason,
                })
            })?;
            Ok(list.into_iter().map(|json_path::Object(a)| a).collect())
        })
        .transpose()?;
        Ok(Self {
            cni_version,
            name: envelope.name,
            plugin_type: envelope.plugin_type,
            prev_result: envelope.prev_result,
            runtime_config: envelope.runtime_config,
            valid_attachments,
            raw,
        })
    }

    /// A plugin-specific key of the config.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.raw.get(key)
    }
}

/// Best effort: the request's `cniVersion` if `bytes` is JSON naming a supported one. Used to
/// label errors that happen before (or while) the config is parsed.
pub fn sniff_version(bytes: &[u8]) -> Option<CniVersion> {
    #[derive(Deserialize)]
    struct OnlyVersion<'a> {
        #[serde(rename = "cniVersion", borrow)]
        cni_version: &'a str,
    }
    let v: OnlyVersion<'_> = serde_json::from_slice(bytes).ok()?;
    CniVersion::parse(v.cni_version).ok()
}

/// Network names: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$` (the spec also forbids characters disallowed
/// in file paths, which this implies). Else code 7.
fn validate_network_name(name: &str) -> Result<(), CniError> {
    let mut chars = name.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(CniError::invalid_config(format!(
            "invalid network config field \"name\": \"{name}\" must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$"
        )))
    }
}

/// Code 7 for a field of the envelope that is not as the spec has it.
fn invalid(e: &json_path::PathError) -> CniError {
    if e.path.is_empty() {
        CniError::invalid_config(format!("network config: {}", e.reason))
    } else {
        CniError::invalid_config(format!("network config field \"{}\" {}", e.path, e.reason))
    }
}

/// A string that is not empty (`null` counts as absent).
fn required_text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None => Err(D::Error::custom("is required")),
        Some(Value::String(s)) if s.is_empty() => Err(D::Error::custom("must not be empty")),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(D::Error::custom(format!(
            "must be a string, got {}",
            type_name(&other)
        ))),
    }
}

/// An object, or absent (`null` too).
fn optional_object<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None => Ok(None),
        Some(v @ Value::Object(_)) => Ok(Some(v)),
        Some(other) => Err(D::Error::custom(format!(
            "must be an object, got {}",
            type_name(&other)
        ))),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(v: &Value) -> Result<NetConf, CniError> {
        NetConf::parse(v.to_string().as_bytes())
    }

    #[test]
    fn parses_envelope_and_keeps_plugin_keys() {
        for ver in CniVersion::ALL {
            let c = parse(&json!({
                "cniVersion": ver.as_str(), "name": "pod-network", "type": "provisioner",
                "mtu": 1460, "ipam": {"subnet": "10.244.1.0/24"},
                "runtimeConfig": {"portMappings": []},
                "prevResult": {"ips": []}
            }))
            .expect("valid config");
            assert_eq!(c.cni_version, ver);
            assert_eq!(c.name, "pod-network");
            assert_eq!(c.plugin_type, "provisioner");
            assert_eq!(c.get("mtu"), Some(&json!(1460)));
            assert_eq!(c.runtime_config, Some(json!({"portMappings": []})));
            assert_eq!(c.prev_result, Some(json!({"ips": []})));
            assert_eq!(c.valid_attachments, None);
        }
    }

    #[test]
    fn null_optionals_are_absent() {
        let c = parse(&json!({"cniVersion":"1.0.0","name":"n","type":"t",
            "prevResult": null, "runtimeConfig": null}))
        .expect("valid");
        assert_eq!(c.prev_result, None);
        assert_eq!(c.runtime_config, None);
    }

    #[test]
    fn undecodable_is_code_6() {
        for bad in [&b"{"[..], b"", b"not json", b"{\"a\":1}}"] {
            let e = NetConf::parse(bad).expect_err("not json");
            assert_eq!(e.code, CniError::DECODE_FAILURE);
        }
    }

    #[test]
    fn structurally_invalid_is_code_7_naming_the_field() {
        let cases = [
            (json!([1]), "object"),
            (json!({"name":"n","type":"t"}), "cniVersion"),
            (json!({"cniVersion":"1.0.0","type":"t"}), "name"),
            (json!({"cniVersion":"1.0.0","name":"n"}), "type"),
            (json!({"cniVersion":1,"name":"n","type":"t"}), "cniVersion"),
            (json!({"cniVersion":"1.0.0","name":7,"type":"t"}), "name"),
            (json!({"cniVersion":"1.0.0","name":"n","type":""}), "type"),
            (json!({"cniVersion":"1.0.0","name":"-n","type":"t"}), "name"),
            (
                json!({"cniVersion":"1.0.0","name":"a/b","type":"t"}),
                "name",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","type":"t","prevResult":[]}),
                "prevResult",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","type":"t","runtimeConfig":"x"}),
                "runtimeConfig",
            ),
            (
                json!({"cniVersion":"1.1.0","name":"n","type":"t",
                "cni.dev/valid-attachments":[{"containerID":"a"}]}),
                "cni.dev/valid-attachments",
            ),
        ];
        for (v, field) in cases {
            let e = parse(&v).expect_err("invalid");
            assert_eq!(e.code, CniError::INVALID_NETWORK_CONFIG, "{v}");
            assert!(e.msg.contains(field), "{v}: {}", e.msg);
        }
    }

    #[test]
    fn unsupported_version_is_code_1() {
        let e = parse(&json!({"cniVersion":"0.2.0","name":"n","type":"t"})).expect_err("old");
        assert_eq!(e.code, CniError::INCOMPATIBLE_VERSION);
        assert!(e.msg.contains("0.2.0"));
    }

    #[test]
    fn valid_attachments_and_alias() {
        let list =
            json!([{"containerID":"c1","ifname":"eth0"},{"containerID":"c2","ifname":"net1"}]);
        let want = vec![
            Attachment {
                container_id: "c1".into(),
                ifname: "eth0".into(),
            },
            Attachment {
                container_id: "c2".into(),
                ifname: "net1".into(),
            },
        ];
        for key in [VALID_ATTACHMENTS_KEY, ATTACHMENTS_KEY_ALIAS] {
            let mut v = json!({"cniVersion":"1.1.0","name":"n","type":"t"});
            v[key] = list.clone();
            assert_eq!(
                parse(&v).expect("valid").valid_attachments,
                Some(want.clone())
            );
        }
        let c = parse(&json!({"cniVersion":"1.1.0","name":"n","type":"t",
            "cni.dev/valid-attachments": []}))
        .expect("valid");
        assert_eq!(c.valid_attachments, Some(vec![]));
    }

    #[test]
    fn sniffs_version() {
        assert_eq!(
            sniff_version(br#"{"cniVersion":"0.4.0","name":5}"#),
            Some(CniVersion::V0_4_0)
        );
        assert_eq!(sniff_version(br#"{"cniVersion":"9.9.9"}"#), None);
        assert_eq!(sniff_version(b"garbage"), None);
    }

    #[test]
    fn wrong_types_are_code_7_naming_field_and_type() {
        for (config, field, got) in [
            (
                json!({"cniVersion":"1.0.0","name": 7,"type":"t"}),
                "\"name\" must be a string",
                "got a number",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","type":"t","prevResult": [1]}),
                "\"prevResult\" must be an object",
                "got an array",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","type":"t","runtimeConfig": true}),
                "\"runtimeConfig\" must be an object",
                "got a boolean",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","type":{}}),
                "\"type\" must be a string",
                "got an object",
            ),
        ] {
            let e = parse(&config).expect_err("wrong type");
            assert_eq!(e.code, CniError::INVALID_NETWORK_CONFIG, "{}", e.msg);
            assert!(e.msg.contains(field) && e.msg.contains(got), "{}", e.msg);
        }
    }
}
