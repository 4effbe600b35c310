//! The `CNI_*` variables of a CNI plugin's environment, as the kernel watch copied it at exec.

/// Longest value kept for a variable: as much as the kernel copies, so that a value is never
/// cut here (a cut `CNI_ARGS` could name a wrong pod); only the copy's first entry can be cut,
/// and it is skipped.
const MAX_VALUE: usize = provisioner_common::ENV_COPY;

/// What a runtime told a CNI plugin it executed.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CniEnv {
    /// `CNI_COMMAND`: ADD, DEL, CHECK, VERSION, ...
    pub command: String,
    /// `CNI_NETNS`: the sandbox's namespace file (empty on some DELs).
    pub netns: String,
    /// `CNI_CONTAINERID`
    pub container_id: String,
    /// `CNI_ARGS`, raw (`K=V;K=V`).
    pub args: Option<String>,
}

impl CniEnv {
    /// The CNI variables of `env` (NUL-separated `KEY=VALUE` entries), or `None` when it holds
    /// no `CNI_COMMAND`. `cut_first`: the copy began inside an entry, which is skipped (a cut
    /// `CNI_ARGS` must not name a wrong pod). A repeated variable's last value wins, as for
    /// the process's own `getenv` of a deduplicated environment.
    pub fn parse(env: &[u8], cut_first: bool) -> Option<Self> {
        let mut entries = env.split(|b| *b == 0);
        if cut_first {
            entries.next();
        }
        let mut found = CniEnv::default();
        let mut command = None;
        for entry in entries {
            let Some(eq) = entry.iter().position(|b| *b == b'=') else {
                continue;
            };
            let (key, value) = (&entry[..eq], &entry[eq + 1..]);
            let slot = match key {
                b"CNI_COMMAND" => command.get_or_insert_with(String::new),
                b"CNI_NETNS" => &mut found.netns,
                b"CNI_CONTAINERID" => &mut found.container_id,
                b"CNI_ARGS" => found.args.get_or_insert_with(String::new),
                _ => continue,
            };
            *slot = text(value);
        }
        found.command = command.filter(|c| !c.is_empty())?;
        Some(found)
    }
}

/// `bytes` as text, bounded and without control characters.
fn text(bytes: &[u8]) -> String {
    let bytes = &bytes[..bytes.len().min(MAX_VALUE)];
    String::from_utf8_lossy(bytes)
        .chars()
        .filter(|c| !c.is_control())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(entries: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        for e in entries {
            out.extend_from_slice(e.as_bytes());
            out.push(0);
        }
        out
    }

    #[test]
    fn reads_what_containerd_sends_its_plugins() {
        let raw = env(&[
            "PATH=/usr/bin",
            "CNI_COMMAND=ADD",
            "CNI_CONTAINERID=4bf982a7",
            "CNI_NETNS=/var/run/netns/cni-1",
            "CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAME=web-0",
            "CNI_IFNAME=lo",
            "CNI_PATH=/opt/cni/bin",
        ]);
        let cni = CniEnv::parse(&raw, false).expect("a CNI call");
        assert_eq!(cni.command, "ADD");
        assert_eq!(cni.netns, "/var/run/netns/cni-1");
        assert_eq!(cni.container_id, "4bf982a7");
        assert_eq!(
            cni.args.as_deref(),
            Some("IgnoreUnknown=1;K8S_POD_NAME=web-0")
        );
    }

    #[test]
    fn a_cut_first_entry_is_not_trusted_and_no_command_is_no_call() {
        // The copy began inside CNI_ARGS: its tail would look like a variable of its own.
        let raw = env(&["S=x;K8S_POD_NAME=wrong", "CNI_COMMAND=DEL", "CNI_NETNS="]);
        let cni = CniEnv::parse(&raw, true).expect("a CNI call");
        assert_eq!((cni.command.as_str(), cni.args), ("DEL", None));
        assert_eq!(CniEnv::parse(&env(&["PATH=/bin", "HOME=/"]), false), None);
        assert_eq!(CniEnv::parse(&env(&["CNI_COMMAND="]), false), None);
        assert_eq!(CniEnv::parse(b"", false), None);
        // The cut entry is CNI_COMMAND itself: no call is claimed.
        assert_eq!(CniEnv::parse(&env(&["CNI_COMMAND=ADD"]), true), None);
    }

    #[test]
    fn values_are_bounded_and_cleaned() {
        let long = format!("CNI_NETNS=/run/\u{1b}netns/{}", "a".repeat(MAX_VALUE));
        let raw = env(&["CNI_COMMAND=ADD", &long]);
        let cni = CniEnv::parse(&raw, false).expect("a CNI call");
        assert!(cni.netns.len() <= MAX_VALUE, "{}", cni.netns.len());
        assert!(cni.netns.starts_with("/run/netns/aaa"), "{}", cni.netns);
    }
}
