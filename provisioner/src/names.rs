//! What the names of a sandbox must be before anything is allocated for it: a container id the
//! store and the host interface name derive from, an interface name the kernel accepts. One
//! rule for every verb and every layer (the CNI plugin, the daemon, the dataplane's own names).

/// Longest Linux interface name (`IFNAMSIZ` - 1).
pub const IFNAME_MAX: usize = 15;

/// Longest container id accepted (runtimes use 64 hex digits).
pub const CONTAINER_ID_MAX: usize = 1024;

/// A name of a sandbox request that cannot be used; each variant says which and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidName {
    #[error("invalid container id {id:?}: {why}")]
    ContainerId { id: String, why: &'static str },
    #[error("invalid interface name {name:?}: {why}")]
    Ifname { name: String, why: &'static str },
}

/// `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`, at most [`CONTAINER_ID_MAX`] bytes (CNI spec).
pub fn container_id(id: &str) -> Result<(), InvalidName> {
    let mut chars = id.chars();
    let why = if id.len() > CONTAINER_ID_MAX {
        Some("longer than 1024 bytes")
    } else if !(chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        Some("must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$")
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some(why) => Err(InvalidName::ContainerId {
            id: shorten(id),
            why,
        }),
    }
}

/// A Linux interface name: non-empty, at most 15 bytes, not `.` or `..`, no `/`, `:`,
/// whitespace or control character.
pub fn ifname(name: &str) -> Result<(), InvalidName> {
    let why = if name.is_empty() {
        Some("is empty")
    } else if name.len() > IFNAME_MAX {
        Some("is longer than 15 bytes")
    } else if name == "." || name == ".." {
        Some("must not be \".\" or \"..\"")
    } else if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control())
    {
        Some("must not contain '/', ':', whitespace or control characters")
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some(why) => Err(InvalidName::Ifname {
            name: shorten(name),
            why,
        }),
    }
}

/// Both names of a sandbox.
pub fn sandbox(container_id: &str, ifname: &str) -> Result<(), InvalidName> {
    self::container_id(container_id)?;
    self::ifname(ifname)
}

/// A name as quoted in a message: at most 80 characters of it.
fn shorten(name: &str) -> String {
    const SHOWN: usize = 80;
    match name.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}...", &name[..cut]),
        None => name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids() {
        for ok in ["a", "0", "abc-1.2_3", "k8s.io-0123456789abcdef"] {
            assert_eq!(container_id(ok), Ok(()), "{ok}");
        }
        for bad in [
            "", "-a", "_a", ".a", "a b", "a/b", "a:b", "é", "a\u{1}b", "a\nb",
        ] {
            let e = container_id(bad).expect_err(bad);
            assert!(e.to_string().contains("invalid container id"), "{e}");
        }
        let long = "a".repeat(CONTAINER_ID_MAX + 1);
        let e = container_id(&long).expect_err("too long");
        assert!(e.to_string().contains("longer than 1024 bytes"), "{e}");
        assert!(
            e.to_string().len() < 200,
            "the message quotes a shortened id"
        );
        assert_eq!(container_id(&"a".repeat(CONTAINER_ID_MAX)), Ok(()));
    }

    #[test]
    fn ifnames() {
        for ok in ["eth0", "a", "net1", "abcdefghijklmno", "veth-._x"] {
            assert_eq!(ifname(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("", "is empty"),
            (".", "must not be"),
            ("..", "must not be"),
            ("abcdefghijklmnop", "longer than 15"),
            ("a/b", "must not contain"),
            ("a:b", "must not contain"),
            ("a b", "must not contain"),
            ("a\tb", "must not contain"),
            ("a\u{1}b", "control characters"),
            ("a\u{7f}", "control characters"),
            ("ééééééééé", "longer than 15"),
        ] {
            let e = ifname(bad).expect_err(bad);
            assert!(e.to_string().contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn names_checks_both() {
        assert_eq!(sandbox("abc", "eth0"), Ok(()));
        assert!(matches!(
            sandbox("-x", "eth0"),
            Err(InvalidName::ContainerId { .. })
        ));
        assert!(matches!(
            sandbox("abc", "e/0"),
            Err(InvalidName::Ifname { .. })
        ));
    }
}
