//! CNI spec versions this plugin speaks, and the VERSION answer.

use std::fmt;
use std::str::FromStr;

use serde_json::{Value, json};

use super::error::CniError;

/// A supported CNI spec version. Ordered oldest to newest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CniVersion {
    V0_3_1,
    V0_4_0,
    V1_0_0,
    V1_1_0,
}

impl CniVersion {
    /// Every supported version, oldest first.
    pub const ALL: [CniVersion; 4] = [Self::V0_3_1, Self::V0_4_0, Self::V1_0_0, Self::V1_1_0];
    /// The newest supported version: used for VERSION and when the request's version is unknown.
    pub const LATEST: CniVersion = Self::V1_1_0;

    pub fn as_str(self) -> &'static str {
        match self {
            Self::V0_3_1 => "0.3.1",
            Self::V0_4_0 => "0.4.0",
            Self::V1_0_0 => "1.0.0",
            Self::V1_1_0 => "1.1.0",
        }
    }

    /// Parses a `cniVersion` string; an unsupported one is error code 1 naming it.
    pub fn parse(s: &str) -> Result<Self, CniError> {
        Self::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| {
                CniError::incompatible_version(format!(
                    "unsupported CNI version \"{s}\" (supported: {})",
                    supported_list()
                ))
            })
    }

    /// Results in this version carry `"version": "4"|"6"` in each `ips` entry (0.3.x / 0.4.0).
    pub fn ips_have_version_field(self) -> bool {
        self < Self::V1_0_0
    }

    /// CHECK exists from 0.4.0 on.
    pub fn supports_check(self) -> bool {
        self >= Self::V0_4_0
    }

    /// STATUS and GC exist from 1.1.0 on.
    pub fn supports_status_and_gc(self) -> bool {
        self >= Self::V1_1_0
    }
}

fn supported_list() -> String {
    CniVersion::ALL.map(CniVersion::as_str).join(", ")
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CniVersion {
    type Err = CniError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// The answer to `CNI_COMMAND=VERSION`.
pub fn version_answer() -> Value {
    json!({
        "cniVersion": CniVersion::LATEST.as_str(),
        "supportedVersions": CniVersion::ALL.map(CniVersion::as_str),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_roundtrip_and_order() {
        for v in CniVersion::ALL {
            assert_eq!(CniVersion::parse(v.as_str()), Ok(v));
            assert_eq!(v.to_string().parse::<CniVersion>(), Ok(v));
        }
        assert!(CniVersion::V0_3_1 < CniVersion::V0_4_0);
        assert!(CniVersion::V0_4_0 < CniVersion::V1_0_0);
        assert!(CniVersion::V1_0_0 < CniVersion::V1_1_0);
        assert_eq!(CniVersion::ALL.iter().max(), Some(&CniVersion::LATEST));
    }

    #[test]
    fn unsupported_is_code_1_naming_it() {
        for bad in ["0.2.0", "0.3.0", "1.2.0", "", "1.0"] {
            let e = CniVersion::parse(bad).expect_err("must be unsupported");
            assert_eq!(e.code, CniError::INCOMPATIBLE_VERSION);
            assert!(e.msg.contains(&format!("\"{bad}\"")), "{}", e.msg);
            assert!(
                e.msg.contains("(supported: 0.3.1, 0.4.0, 1.0.0, 1.1.0)"),
                "the answer says what would work: {}",
                e.msg
            );
        }
    }

    #[test]
    fn feature_gates() {
        assert!(CniVersion::V0_3_1.ips_have_version_field());
        assert!(CniVersion::V0_4_0.ips_have_version_field());
        assert!(!CniVersion::V1_0_0.ips_have_version_field());
        assert!(!CniVersion::V0_3_1.supports_check());
        assert!(CniVersion::V0_4_0.supports_check());
        assert!(!CniVersion::V1_0_0.supports_status_and_gc());
        assert!(CniVersion::V1_1_0.supports_status_and_gc());
    }

    #[test]
    fn version_answer_shape() {
        assert_eq!(
            version_answer(),
            json!({"cniVersion":"1.1.0","supportedVersions":["0.3.1","0.4.0","1.0.0","1.1.0"]})
        );
    }
}
