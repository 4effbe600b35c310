//! Debian's kernels, fetched from its package registry with a private apt configuration (the
//! machine's own sources are never read or changed): the newest generic image of each series,
//! chosen when the matrix runs (the ABI number in the package names rotates as Debian publishes
//! point releases and old ones leave the archive).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::bootstrap::tools_dir;
use crate::step::{detail, output, run};

/// A kernel series and the Debian release whose suites hold it.
#[derive(Clone, Copy, Debug)]
pub struct Series {
    /// e.g. `5.10`.
    pub series: &'static str,
    /// e.g. `bullseye`.
    pub release: &'static str,
    /// The production kernels it stands in for.
    pub stands_in_for: &'static str,
}

/// The series the matrix boots, oldest first.
pub const SERIES: [Series; 3] = [
    Series {
        series: "5.10",
        release: "bullseye",
        stands_in_for: "Debian 11; RHEL 9 (5.14) and Ubuntu 22.04 (5.15) lie between it and 6.1",
    },
    Series {
        series: "6.1",
        release: "bookworm",
        stands_in_for: "Debian 12, Amazon Linux 2023, COS",
    },
    Series {
        series: "6.12",
        release: "trixie",
        stands_in_for: "Debian 13, RHEL 10",
    },
];

/// A kernel ready to boot: its image, with its modules indexed beside it (`lib/modules/<release>`
/// of the unpacked package, where virtme-ng takes them from).
#[derive(Clone, Debug)]
pub struct GuestKernel {
    pub series: Series,
    /// The package it came from, e.g. `linux-image-5.10.0-46-amd64-unsigned` 5.10.262-1.
    pub package: String,
    pub version: String,
    /// `uname -r` of the kernel, e.g. `5.10.0-46-amd64`.
    pub release: String,
    pub vmlinuz: PathBuf,
}

/// Where kernels are cached.
fn cache_dir() -> PathBuf {
    tools_dir().join("kernels")
}

/// Fetches (or finds in the cache) the newest generic image of each of `series`.
pub fn fetch(series: &[Series]) -> Result<Vec<GuestKernel>> {
    series.iter().map(|s| fetch_one(*s)).collect()
}

fn fetch_one(series: Series) -> Result<GuestKernel> {
    let apt = PrivateApt::new(series.release)?;
    apt.update()?;
    let (package, version) = apt.newest_image(series.series)?;
    detail(&format!("{} {version} ({})", package, series.release));
    let unpacked = cache_dir()
        .join("unpacked")
        .join(format!("{package}_{version}"));
    if !unpacked.join("done").exists() {
        let deb = apt.download(&package, &version)?;
        let _ = std::fs::remove_dir_all(&unpacked);
        std::fs::create_dir_all(&unpacked)?;
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
        std::fs::remove_file(&deb).with_context(|| format!("remove {}", deb.display()))?;
        std::fs::write(unpacked.join("done"), "")?;
    }
    let release = kernel_release(&unpacked)?;
    let vmlinuz = unpacked.join("boot").join(format!("vmlinuz-{release}"));
    if !vmlinuz.exists() {
        bail!("{package} {version} has no {}", vmlinuz.display());
    }
    index_modules(&unpacked, &release)?;
    Ok(GuestKernel {
        series,
        package,
        version,
        release,
        vmlinuz,
    })
}

/// The kernel release of an unpacked image package (its one `lib/modules/<release>`, under
/// `usr/` in newer packages).
fn kernel_release(unpacked: &Path) -> Result<String> {
    for dir in ["lib/modules", "usr/lib/modules"] {
        let Ok(entries) = std::fs::read_dir(unpacked.join(dir)) else {
            continue;
        };
        if let Some(entry) = entries.filter_map(Result::ok).next() {
            return Ok(entry.file_name().to_string_lossy().into_owned());
        }
    }
    bail!("no lib/modules/<release> in {}", unpacked.display())
}

/// Puts the package's modules at `lib/modules/<release>` beside its image (newer packages have
/// them under `usr/`) and indexes them (depmod), once.
fn index_modules(unpacked: &Path, release: &str) -> Result<()> {
    let modules = unpacked.join("lib/modules").join(release);
    if modules.join("modules.dep").exists() {
        return Ok(());
    }
    let merged = unpacked.join("usr/lib/modules").join(release);
    if !modules.is_dir() && merged.is_dir() {
        std::fs::create_dir_all(unpacked.join("lib/modules"))?;
        std::fs::rename(&merged, &modules)
            .with_context(|| format!("move {} to {}", merged.display(), modules.display()))?;
    }
    if !modules.is_dir() {
        bail!("no modules of {release} in {}", unpacked.display());
    }
    run(Command::new("depmod").arg("-b").arg(unpacked).arg(release))
}

/// apt with its own sources, lists and cache for one Debian release.
struct PrivateApt {
    dir: PathBuf,
}

impl PrivateApt {
    fn new(release: &str) -> Result<Self> {
        let dir = cache_dir().join("apt").join(release);
        std::fs::create_dir_all(dir.join("lists/partial"))?;
        std::fs::create_dir_all(dir.join("cache/archives/partial"))?;
        std::fs::create_dir_all(dir.join("debs"))?;
        let keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
        let source =
            |url: &str, suite: &str| format!("deb [signed-by={keyring}] {url} {suite} main\n");
        let debian = "http://deb.debian.org/debian";
        let sources = [
            source(debian, release),
            source(debian, &format!("{release}-updates")),
            source(
                "http://deb.debian.org/debian-security",
                &format!("{release}-security"),
            ),
        ]
        .concat();
        std::fs::write(dir.join("sources.list"), sources)?;
        Ok(Self { dir })
    }

    /// `cmd` (apt-get or apt-cache) with this configuration.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        let option = |key: &str, value: &Path| format!("{key}={}", value.display());
        for (key, value) in [
            ("Dir::Etc::SourceList", self.dir.join("sources.list")),
            ("Dir::Etc::SourceParts", PathBuf::from("/dev/null")),
            ("Dir::State::Lists", self.dir.join("lists")),
            ("Dir::Cache", self.dir.join("cache")),
        ] {
            cmd.arg("-o").arg(option(key, &value));
        }
        cmd.args(["-o", "Debug::NoLocking=1", "-o", "APT::Get::List-Cleanup=0"]);
        cmd
    }

    fn update(&self) -> Result<()> {
        run(self.command("apt-get").args(["update", "-qq"]))
    }

    /// The newest `linux-image-<series>...-amd64-unsigned` (the generic image: the cloud
    /// kernels have no 9p, which the VMs mount the host's files with) and its version.
    fn newest_image(&self, series: &str) -> Result<(String, String)> {
        let names = output(self.command("apt-cache").args([
            "search",
            "--names-only",
            &format!("^linux-image-{series}"),
        ]))
        .context("apt-cache search")?;
        let images: Vec<String> = names
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|name| is_generic_image(name, series))
            .map(str::to_owned)
            .collect();
        if images.is_empty() {
            bail!("no linux-image-{series}*-amd64-unsigned in the registry's suites");
        }
        let shown = output(
            self.command("apt-cache")
                .args(["show", "--no-all-versions"])
                .args(&images),
        )
        .context("apt-cache show")?;
        let mut newest: Option<(String, String)> = None;
        for (name, version) in packages_and_versions(&shown) {
            let newer = match &newest {
                None => true,
                Some((_, best)) => Command::new("dpkg")
                    .args(["--compare-versions", &version, "gt", best])
                    .status()
                    .is_ok_and(|s| s.success()),
            };
            if newer {
                newest = Some((name, version));
            }
        }
        newest.context("apt-cache show listed no version")
    }

    /// Downloads `package` `version` into this configuration's directory; the .deb's path.
    fn download(&self, package: &str, version: &str) -> Result<PathBuf> {
        let debs = self.dir.join("debs");
        run(self
            .command("apt-get")
            .args(["download", "-qq", &format!("{package}={version}")])
            .current_dir(&debs))?;
        std::fs::read_dir(&debs)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{package}_")))
            })
            .with_context(|| format!("apt-get download left no {package}_*.deb"))
    }
}

/// Whether `name` is the generic amd64 image of `series`: `linux-image-<series>[.N...]
/// [-ABI][+debN]-amd64-unsigned`, and not a cloud, realtime or backported one.
fn is_generic_image(name: &str, series: &str) -> bool {
    let Some(rest) = name
        .strip_prefix("linux-image-")
        .and_then(|r| r.strip_prefix(series))
        .and_then(|r| r.strip_suffix("-amd64-unsigned"))
    else {
        return false;
    };
    // What follows the series: `.0-46`, `.118+deb13`; never `2.118...` (6.12 after 6.1) nor a
    // backport's `.0-0.deb11.48`.
    (rest.is_empty() || rest.starts_with('.') || rest.starts_with('-'))
        && !rest.contains("cloud")
        && !rest.contains("rt")
        && !rest.contains("-0.deb")
}

/// `(Package, Version)` of each stanza of `apt-cache show` output.
fn packages_and_versions(shown: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut package = None;
    for line in shown.lines() {
        if let Some(name) = line.strip_prefix("Package: ") {
            package = Some(name.trim().to_owned());
        } else if let Some(version) = line.strip_prefix("Version: ")
            && let Some(name) = package.take()
        {
            found.push((name, version.trim().to_owned()));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generic_images_of_a_series_are_told_from_the_rest() {
        assert!(is_generic_image(
            "linux-image-5.10.0-46-amd64-unsigned",
            "5.10"
        ));
        assert!(is_generic_image(
            "linux-image-6.1.0-57-amd64-unsigned",
            "6.1"
        ));
        assert!(is_generic_image(
            "linux-image-6.12.118+deb13-amd64-unsigned",
            "6.12"
        ));
        assert!(!is_generic_image(
            "linux-image-6.12.118+deb12-amd64-unsigned",
            "6.1"
        ));
        assert!(!is_generic_image(
            "linux-image-5.10.0-46-cloud-amd64-unsigned",
            "5.10"
        ));
        assert!(!is_generic_image(
            "linux-image-5.10.0-46-rt-amd64-unsigned",
            "5.10"
        ));
        assert!(!is_generic_image(
            "linux-image-6.1.0-0.deb11.48-amd64-unsigned",
            "6.1"
        ));
        assert!(!is_generic_image("linux-image-5.10.0-46-amd64", "5.10"));
    }

    #[test]
    fn stanzas_give_their_package_and_version() {
        let shown =
            "Package: a\nVersion: 1.2-3\nDescription: x\n\nPackage: b\nSource: s\nVersion: 2\n";
        assert_eq!(
            packages_and_versions(shown),
            vec![("a".into(), "1.2-3".into()), ("b".into(), "2".into())]
        );
    }
}
