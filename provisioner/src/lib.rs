//! provisioner: gives container sandboxes their network through netlink and proves, from the
//! kernel, that every sandbox really got it.
//!
//! Dependency direction is one way, top to bottom ([`layering`] holds the code to it):
//! - `daemon` (socket API, readiness, the kernel watch) uses any module below;
//! - `sandbox` (ADD/DEL/CHECK/GC) -> `config`, `ipam`, `dataplane`, `cni` (the result of ADD);
//! - `metrics` -> `ipam`, `trace` (what it exposes);
//! - `cni` (the wire format) uses only the leaves: its netns path check is the dataplane's
//!   own, from the leaf `nsfs`;
//! - `trace` -> `dataplane` (namespace snapshots), `runtime`;
//! - `config` -> `ipam` (ranges);
//! - `ipam`, `dataplane` and `runtime` use only the leaves `pod`, `names`, `failpoint`,
//!   `memory`, `nsfs`, `json_path`, `text`: ipam knows nothing of the dataplane, the
//!   dataplane nothing of CNI JSON, the runtime module no tracing and no netlink.

pub mod cni;
pub mod config;
pub mod daemon;
pub mod dataplane;
pub mod failpoint;
pub mod ipam;
mod json_path;
pub mod memory;
pub mod metrics;
pub mod names;
mod nsfs;
pub mod pod;
pub mod runtime;
pub mod sandbox;
pub mod text;
pub mod trace;

#[cfg(test)]
mod layering {
    //! The graph above, checked against the `crate::` paths each module's sources name.

    const LEAVES: &[&str] = &[
        "pod",
        "names",
        "failpoint",
        "memory",
        "nsfs",
        "json_path",
        "text",
    ];

    /// Module -> the modules (besides the leaves) it may use.
    const ALLOWED: &[(&str, &[&str])] = &[
        ("sandbox", &["config", "ipam", "dataplane", "cni"]),
        ("metrics", &["ipam", "trace"]),
        ("cni", &[]),
        ("trace", &["dataplane", "runtime"]),
        ("config", &["ipam"]),
        ("ipam", &[]),
        ("dataplane", &[]),
        ("runtime", &[]),
        ("pod", &[]),
        ("names", &[]),
        ("nsfs", &[]),
        ("json_path", &[]),
        ("failpoint", &[]),
        ("memory", &[]),
        ("text", &[]),
    ];

    fn sources(module: &str) -> Vec<(std::path::PathBuf, String)> {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        walk(&src.join(module), &mut files);
        files.push(src.join(format!("{module}.rs")));
        files
            .into_iter()
            .filter_map(|f| Some((f.clone(), std::fs::read_to_string(&f).ok()?)))
            .collect()
    }

    #[test]
    fn modules_use_only_what_the_graph_allows() {
        let modules: Vec<&str> = ALLOWED.iter().map(|(m, _)| *m).chain(["daemon"]).collect();
        for (module, allowed) in ALLOWED {
            for (file, text) in sources(module) {
                for used in &modules {
                    let path = format!("crate::{used}");
                    let uses = text.match_indices(&path).any(|(at, _)| {
                        !text[at + path.len()..]
                            .starts_with(|c: char| c.is_alphanumeric() || c == '_')
                    });
                    assert!(
                        !uses || used == module || LEAVES.contains(used) || allowed.contains(used),
                        "{} uses crate::{used}, which `{module}` may not (src/lib.rs)",
                        file.display()
                    );
                }
            }
        }
    }
}
