//! The programs the tests run that are not part of the build, each with the Debian package that
//! installs it: a test whose tool is missing fails naming the package, and `cargo xtask test`
//! installs every package listed here before the tests run.

use std::path::Path;

use anyhow::{Result, bail};

/// A program a test runs, at the path its package installs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tool {
    pub path: &'static str,
    pub package: &'static str,
}

pub const IP: Tool = Tool {
    path: "/usr/sbin/ip",
    package: "iproute2",
};
pub const PING: Tool = Tool {
    path: "/usr/bin/ping",
    package: "iputils-ping",
};
pub const PRLIMIT: Tool = Tool {
    path: "/usr/bin/prlimit",
    package: "util-linux",
};
pub const UNSHARE: Tool = Tool {
    path: "/usr/bin/unshare",
    package: "util-linux",
};
pub const MOUNT: Tool = Tool {
    path: "/usr/bin/mount",
    package: "mount",
};
pub const UMOUNT: Tool = Tool {
    path: "/usr/bin/umount",
    package: "mount",
};
/// The reference plugins (ptp, host-local) and the `loopback` every runtime runs.
pub const PTP: Tool = Tool {
    path: "/usr/lib/cni/ptp",
    package: "containernetworking-plugins",
};
pub const LOOPBACK: Tool = Tool {
    path: "/usr/lib/cni/loopback",
    package: "containernetworking-plugins",
};
/// The meta plugins a runtime chains after the network plugin (hostPort, traffic shaping).
pub const PORTMAP: Tool = Tool {
    path: "/usr/lib/cni/portmap",
    package: "containernetworking-plugins",
};
pub const BANDWIDTH: Tool = Tool {
    path: "/usr/lib/cni/bandwidth",
    package: "containernetworking-plugins",
};
pub const CONTAINERD: Tool = Tool {
    path: "/usr/bin/containerd",
    package: "containerd",
};
pub const CTR: Tool = Tool {
    path: "/usr/bin/ctr",
    package: "containerd",
};
/// The OCI runtime of containerd and podman (crun 1.8 fails on this kind of cgroup hybrid
/// setup).
pub const RUNC: Tool = Tool {
    path: "/usr/sbin/runc",
    package: "runc",
};
/// Installs /etc/cni/net.d/87-podman-bridge.conflist; the tests never read /etc/cni/net.d.
pub const PODMAN: Tool = Tool {
    path: "/usr/bin/podman",
    package: "podman",
};
pub const CONMON: Tool = Tool {
    path: "/usr/bin/conmon",
    package: "conmon",
};
/// The tests' pause and busybox images (no registry): a static busybox, which Debian's
/// dynamic `busybox` package is not (the image tests refuse that one by its ELF interpreter).
pub const BUSYBOX: Tool = Tool {
    path: "/bin/busybox",
    package: "busybox-static",
};
pub const PROMETHEUS: Tool = Tool {
    path: "/usr/bin/prometheus",
    package: "prometheus",
};
pub const PROMTOOL: Tool = Tool {
    path: "/usr/bin/promtool",
    package: "prometheus",
};
pub const SYSTEMD_ANALYZE: Tool = Tool {
    path: "/usr/bin/systemd-analyze",
    package: "systemd",
};
/// The engine that `docker load`s the image, and Debian's client of that engine's own version
/// (another `docker` on the PATH may be newer).
pub const DOCKERD: Tool = Tool {
    path: "/usr/sbin/dockerd",
    package: "docker.io",
};
pub const DOCKER: Tool = Tool {
    path: "/usr/bin/docker",
    package: "docker.io",
};

/// Every tool a test runs.
pub const ALL: &[Tool] = &[
    IP,
    PING,
    PRLIMIT,
    UNSHARE,
    MOUNT,
    UMOUNT,
    PTP,
    LOOPBACK,
    PORTMAP,
    BANDWIDTH,
    CONTAINERD,
    CTR,
    RUNC,
    PODMAN,
    CONMON,
    BUSYBOX,
    PROMETHEUS,
    PROMTOOL,
    SYSTEMD_ANALYZE,
    DOCKERD,
    DOCKER,
];

impl Tool {
    /// The tool's path, or an error naming the package to install.
    pub fn require(&self) -> Result<&'static Path> {
        if Path::new(self.path).exists() {
            Ok(Path::new(self.path))
        } else {
            bail!("{}", self.missing())
        }
    }

    /// `X is missing: install P (cargo xtask test installs it)`.
    pub fn missing(&self) -> String {
        format!(
            "{} is missing: install {} (`apt-get install {}`; cargo xtask test installs it)",
            self.path, self.package, self.package
        )
    }
}

/// The tool that `program` (a name, or a path) is, when it is one of [`ALL`].
pub fn named(program: &str) -> Option<Tool> {
    let name = Path::new(program).file_name()?;
    ALL.iter()
        .copied()
        .find(|t| Path::new(t.path).file_name() == Some(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_tool_fails_naming_its_package() {
        let tool = Tool {
            path: "/nonexistent/provisioner-test-tool",
            package: "provisioner-test-package",
        };
        let err = tool.require().expect_err("the tool is missing");
        assert_eq!(
            err.to_string(),
            "/nonexistent/provisioner-test-tool is missing: install provisioner-test-package \
             (`apt-get install provisioner-test-package`; cargo xtask test installs it)"
        );
        assert_eq!(
            Tool {
                path: "/bin/sh",
                ..tool
            }
            .require()
            .expect("/bin/sh is there"),
            Path::new("/bin/sh")
        );
    }

    #[test]
    fn a_program_is_found_by_its_name_or_path() {
        assert_eq!(named("ip"), Some(IP));
        assert_eq!(named("/usr/bin/promtool"), Some(PROMTOOL));
        assert_eq!(named("systemd-analyze"), Some(SYSTEMD_ANALYZE));
        assert_eq!(named("provisioner"), None);
    }

    #[test]
    fn every_tool_has_a_package_and_an_absolute_path() {
        for tool in ALL {
            assert!(tool.path.starts_with('/'), "{tool:?}");
            assert!(!tool.package.is_empty(), "{tool:?}");
        }
    }
}
