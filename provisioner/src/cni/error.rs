//! The CNI error: a numeric code, a short message and optional details, printed as JSON on stdout.
//!
//! | code | constant                        | meaning                                                        |
//! |------|---------------------------------|----------------------------------------------------------------|
//! | 1    | [`CniError::INCOMPATIBLE_VERSION`] | incompatible / unsupported `cniVersion` (or verb not in it)  |
//! | 2    | [`CniError::UNSUPPORTED_FIELD`] | unsupported field in the network config (msg names key+value)  |
//! | 3    | [`CniError::UNKNOWN_CONTAINER`] | container unknown or does not exist: no cleanup needed         |
//! | 4    | [`CniError::INVALID_ENV`]       | missing / invalid `CNI_*` environment variable (msg names it)   |
//! | 5    | [`CniError::IO_FAILURE`]        | I/O failure (e.g. reading stdin, opening the netns)            |
//! | 6    | [`CniError::DECODE_FAILURE`]    | content could not be decoded (e.g. stdin is not JSON)          |
//! | 7    | [`CniError::INVALID_NETWORK_CONFIG`] | network config fails validation (msg names the field)     |
//! | 11   | [`CniError::TRY_AGAIN_LATER`]   | transient condition (e.g. daemon unreachable): retry later     |
//! | 50   | [`CniError::PLUGIN_NOT_AVAILABLE`] | STATUS: plugin cannot service ADD                           |
//! | 51   | [`CniError::LIMITED_CONNECTIVITY`] | STATUS: not available, existing containers may be affected  |
//! | 100  | [`CniError::INTERNAL`]          | provisioner: internal / daemon error                           |
//! | 101  | [`CniError::ADDRESS_EXHAUSTED`] | provisioner: no free address in the pod CIDR                   |
//! | 102  | [`CniError::INTERFACE_EXISTS`]  | provisioner: `CNI_IFNAME` already exists in the sandbox         |
//! | 103  | [`CniError::CONFIG_MISMATCH`]   | provisioner: request's network config differs from the daemon's |
//! | 104  | [`CniError::DATAPLANE_FAILURE`] | provisioner: a netlink operation failed                        |
//! | 105  | [`CniError::CHECK_FAILED`]      | provisioner: CHECK found the sandbox not as `prevResult` says   |
//!
//! Codes 0-99 are reserved by the spec; 100+ are provisioner's own.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::version::CniVersion;

/// A CNI error result. `details` is omitted from the JSON when empty (it is optional in the spec).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("CNI error {code}: {msg}{}", details_suffix(.details))]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

fn details_suffix(details: &str) -> String {
    if details.is_empty() {
        String::new()
    } else {
        format!(" ({details})")
    }
}

impl CniError {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Unsupported field in network configuration.
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// Container unknown or does not exist.
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// Invalid necessary environment variables.
    pub const INVALID_ENV: u32 = 4;
    /// I/O failure.
    pub const IO_FAILURE: u32 = 5;
    /// Failed to decode content.
    pub const DECODE_FAILURE: u32 = 6;
    /// Invalid network config.
    pub const INVALID_NETWORK_CONFIG: u32 = 7;
    /// Try again later.
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: the plugin is not available (cannot service ADD).
    pub const PLUGIN_NOT_AVAILABLE: u32 = 50;
    /// STATUS: not available, and existing containers may have limited connectivity.
    pub const LIMITED_CONNECTIVITY: u32 = 51;
    /// provisioner: internal or daemon error.
    pub const INTERNAL: u32 = 100;
    /// provisioner: address range exhausted.
    pub const ADDRESS_EXHAUSTED: u32 = 101;
    /// provisioner: the interface already exists in the sandbox.
    pub const INTERFACE_EXISTS: u32 = 102;
    /// provisioner: network config does not match the daemon's.
    pub const CONFIG_MISMATCH: u32 = 103;
    /// provisioner: dataplane (netlink) failure.
    pub const DATAPLANE_FAILURE: u32 = 104;
    /// provisioner: CHECK found a difference from `prevResult`.
    pub const CHECK_FAILED: u32 = 105;

    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    #[must_use]
    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    pub fn incompatible_version(msg: impl Into<String>) -> Self {
        Self::new(Self::INCOMPATIBLE_VERSION, msg)
    }

    pub fn invalid_env(msg: impl Into<String>) -> Self {
        Self::new(Self::INVALID_ENV, msg)
    }

    pub fn decode(msg: impl Into<String>) -> Self {
        Self::new(Self::DECODE_FAILURE, msg)
    }

    pub fn invalid_config(msg: impl Into<String>) -> Self {
        Self::new(Self::INVALID_NETWORK_CONFIG, msg)
    }

    pub fn try_again_later(msg: impl Into<String>) -> Self {
        Self::new(Self::TRY_AGAIN_LATER, msg)
    }

    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(Self::INTERNAL, msg)
    }

    /// The error as the spec's JSON error result, labelled with `version`.
    pub fn to_json(&self, version: CniVersion) -> Value {
        let mut v = json!({
            "cniVersion": version.as_str(),
            "code": self.code,
            "msg": self.msg,
        });
        if !self.details.is_empty() {
            v["details"] = Value::String(self.details.clone());
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape_with_and_without_details() {
        let e = CniError::invalid_env("bad").with_details("more");
        assert_eq!(
            e.to_json(CniVersion::V1_0_0),
            json!({"cniVersion":"1.0.0","code":4,"msg":"bad","details":"more"})
        );
        let e = CniError::try_again_later("later");
        assert_eq!(
            e.to_json(CniVersion::V0_4_0),
            json!({"cniVersion":"0.4.0","code":11,"msg":"later"})
        );
    }

    #[test]
    fn well_known_codes() {
        let codes = [
            (CniError::INCOMPATIBLE_VERSION, 1),
            (CniError::UNSUPPORTED_FIELD, 2),
            (CniError::UNKNOWN_CONTAINER, 3),
            (CniError::INVALID_ENV, 4),
            (CniError::IO_FAILURE, 5),
            (CniError::DECODE_FAILURE, 6),
            (CniError::INVALID_NETWORK_CONFIG, 7),
            (CniError::TRY_AGAIN_LATER, 11),
            (CniError::PLUGIN_NOT_AVAILABLE, 50),
            (CniError::LIMITED_CONNECTIVITY, 51),
            // provisioner's own, as docs/operating.md documents them
            (CniError::INTERNAL, 100),
            (CniError::ADDRESS_EXHAUSTED, 101),
            (CniError::INTERFACE_EXISTS, 102),
            (CniError::CONFIG_MISMATCH, 103),
            (CniError::DATAPLANE_FAILURE, 104),
            (CniError::CHECK_FAILED, 105),
        ];
        for (c, want) in codes {
            assert_eq!(c, want);
        }
    }

    #[test]
    fn constructors_set_their_codes() {
        for (e, code) in [
            (CniError::incompatible_version("v"), 1),
            (CniError::invalid_env("e"), 4),
            (CniError::decode("d"), 6),
            (CniError::invalid_config("c"), 7),
            (CniError::try_again_later("t"), 11),
            (CniError::internal("i"), 100),
        ] {
            assert_eq!(e.code, code, "{e}");
            assert!(e.details.is_empty());
        }
    }

    #[test]
    fn display_and_serde_roundtrip() {
        let e = CniError::new(101, "no free address").with_details("10.0.0.0/28");
        assert_eq!(
            e.to_string(),
            "CNI error 101: no free address (10.0.0.0/28)"
        );
        let back: CniError =
            serde_json::from_str(r#"{"code":11,"msg":"x"}"#).expect("valid error json");
        assert_eq!(back, CniError::try_again_later("x"));
    }
}
