//! `cargo xtask kernel-matrix`: the kernel-level tests on every kernel the product supports.
//!
//! Debian's kernels of the series in [`kernels::SERIES`] are fetched from its package
//! registry and booted under qemu with the host's userland ([`vm`]); in each, the guest runner
//! ([`guest`]) prints what the kernel watch runs on and the result of each kernel-level test
//! as lines the harness reads back. The host runs the same tests twice: as its kernel offers,
//! and with the backends of older kernels forced, so that those backends are also tested at
//! native speed. The report (`target/kernel-matrix/report.md`) is the kernel table of
//! docs/install.md.

mod guest;
mod kernels;
mod report;
mod vm;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

pub use guest::{Plan, TestModule, run as run_guest};
use report::Row;

use crate::step::{announce, cargo, detail, workspace_root};

/// The kernel-level tests (test binary, module, tests): what the kernel watch sees and judges on a
/// real kernel. Every verdict kind (skipped, partial, failed, gone, networked) on sandboxes of a
/// stand-in runtime; no false alarm for our plugin, ptp + host-local and podman; pods named from a
/// plugin's environment; containerd's loopback-only failure with real containerd; the daemon's ADDs
/// confirmed and its audit of live sandboxes at start; `provisioner trace` alone; no container's
/// environment read. What the host's suite runs besides is left out: under software emulation every
/// test costs minutes.
pub const KERNEL_TESTS: &[(&str, &str, &[&str])] = &[
    (
        "integration",
        "trace_verdicts",
        &[
            "runtime_created_sandboxes_without_network_are_skipped_naming_the_creator",
            "interface_without_address_is_partial",
            "route_the_kernel_rejects_is_failed_with_the_reason",
            "non_runtime_namespace_destroyed_after_100ms_is_gone_never_skipped",
            "reference_ptp_plugin_sandbox_is_networked_and_the_plugin_exec_shows",
            "sandboxes_pinned_before_tracing_starts_are_judged_from_their_state",
            "short_lived_sandboxes_wired_then_removed_are_networked_with_their_teardown",
            "a_sandbox_skipped_after_a_runtime_ran_a_plugin_names_the_plugins_pod",
        ],
    ),
    (
        "integration",
        "containerd_loopback_only",
        &["loopback_only_conf_dir_network_ready_but_pods_skipped"],
    ),
    (
        "integration",
        "daemon_trace",
        &[
            "daemon_adds_are_confirmed_from_the_trace_before_their_deadline",
            "restart_after_sigkill_audits_live_sandboxes",
        ],
    ),
    (
        "integration",
        "podman",
        &["podman_container_gets_our_address_and_rm_releases_it"],
    ),
    (
        "integration",
        "watch_environment",
        &["a_containers_environment_is_never_read_while_containerds_plugins_are"],
    ),
    (
        "integration",
        "trace_session",
        &["trace_started_on_a_node_with_wired_sandboxes_reports_them_networked_from_their_state"],
    ),
    (
        "integration",
        "trace_netns",
        &[
            "unshare_reports_one_event_with_the_right_cookie",
            "clone_with_newnet_reports_the_child_namespace",
        ],
    ),
    (
        "load",
        "trace_burst",
        &["burst_of_2000_netns_creations_is_fully_accounted_for"],
    ),
    (
        "integration",
        "trace_backends",
        &[
            "every_observation_has_a_backend_and_btf_tracepoints_attach_no_syscall_tracepoint",
            "a_backend_chosen_instead_of_the_probes_is_attached_and_reported",
            "this_kernels_verifier_takes_the_programs_of_every_backend_it_offers",
        ],
    ),
];

/// The backends of the oldest kernels, forced in the host's second run.
pub const OLDER_KERNELS_BACKENDS: &str = "unshare_and_mounts=syscall_tracepoints,rtnetlink=syscall_tracepoints,error_messages=fentry,namespace_ids=inode_generation";

use testkit::TIME_SCALE_ENV;

#[derive(Clone, Debug)]
pub struct Options {
    /// Only these series (e.g. `5.10`); all of [`kernels::SERIES`] when empty.
    pub series: Vec<String>,
    /// The host's runs: both, or only the one with older kernels' backends forced (where the
    /// host's whole suite runs anyway), or none.
    pub host: HostRuns,
    /// Factor on the tests' waits and deadlines in the VMs (software emulation is slow).
    pub time_scale: f64,
    /// Longest a guest may run.
    pub timeout: Duration,
    /// Only the kernel-level tests whose `module::test` contains one of these; all when empty.
    pub tests: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostRuns {
    Both,
    OlderBackendsOnly,
    None,
}

impl Options {
    /// What `cargo xtask test` runs: every series, the host's run with older kernels'
    /// backends (the suite runs the host's own).
    pub fn for_the_suite() -> Self {
        Self {
            series: Vec::new(),
            host: HostRuns::OlderBackendsOnly,
            time_scale: DEFAULT_TIME_SCALE,
            timeout: Duration::from_secs(20 * 60),
            tests: Vec::new(),
        }
    }
}

/// The guests' factor on the tests' waits and deadlines.
pub const DEFAULT_TIME_SCALE: f64 = 6.0;

/// `cargo xtask kernel-matrix`: the guests, and the host's runs while they run.
pub fn run(opts: &Options) -> Result<()> {
    let running = start(opts)?;
    running.finish()
}

/// The guests booted, running their tests; [`Self::finish`] waits for them, runs the host's
/// runs and reports.
pub struct Running {
    opts: Options,
    out: PathBuf,
    provisioner: PathBuf,
    tests: Vec<TestModule>,
    guests: Vec<(kernels::GuestKernel, vm::Guest)>,
}

/// Fetches the kernels, builds the tests and boots every guest (one vCPU each: their tests
/// mostly wait, so the guests share the machine's CPUs with what runs meanwhile).
pub fn start(opts: &Options) -> Result<Running> {
    crate::bootstrap::apt_packages()?;
    crate::ebpf::build_once_for_all()?;
    let vng = vm::bootstrap()?;
    let series: Vec<kernels::Series> = kernels::SERIES
        .into_iter()
        .filter(|s| opts.series.is_empty() || opts.series.iter().any(|w| w == s.series))
        .collect();
    if series.is_empty() {
        bail!(
            "no kernel series matches {:?} (known: {})",
            opts.series,
            kernels::SERIES.map(|s| s.series).join(", ")
        );
    }
    announce("matrix", "Debian kernels (private apt configuration)");
    let kernels = kernels::fetch(&series)?;
    let (provisioner, tests) = build(&opts.tests)?;
    let out = workspace_root().join("target/kernel-matrix");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    let xtask = std::env::current_exe().context("the xtask binary")?;
    let names: Vec<&str> = kernels.iter().map(|k| k.release.as_str()).collect();
    announce(
        "matrix",
        &format!(
            "booting {} under qemu (software emulation, one vCPU each); they run beside what follows",
            names.join(", ")
        ),
    );
    let mut guests = Vec::new();
    for kernel in kernels {
        let dir = out.join(&kernel.release);
        std::fs::create_dir_all(&dir)?;
        let plan = Plan {
            out: dir.clone(),
            provisioner: provisioner.clone(),
            tests: tests.clone(),
            env: vec![(TIME_SCALE_ENV.to_owned(), opts.time_scale.to_string())],
        };
        let plan_file = dir.join("plan");
        std::fs::write(&plan_file, plan.to_text())?;
        let command = vec![
            xtask.display().to_string(),
            "matrix-guest".into(),
            plan_file.display().to_string(),
        ];
        let console = out.join(format!("{}.console", kernel.release));
        detail(&format!(
            "{} ({} {}); console: {}",
            kernel.release,
            kernel.package,
            kernel.version,
            console.display()
        ));
        let guest = vm::Guest::boot(&vng, &kernel, &command, &dir, &console)?;
        guests.push((kernel, guest));
    }
    Ok(Running {
        opts: opts.clone(),
        out,
        provisioner,
        tests,
        guests,
    })
}

impl Running {
    /// Runs the host's runs, waits for the guests, writes the report; fails naming every test
    /// that did not pass on some kernel.
    pub fn finish(mut self) -> Result<()> {
        let mut rows = host_rows(self.opts.host, &self.out, &self.provisioner, &self.tests)?;
        announce("matrix", "waiting for the kernels' guests");
        let timed_out = {
            let mut running: Vec<(String, &mut vm::Guest)> = self
                .guests
                .iter_mut()
                .map(|(k, g)| (k.release.clone(), g))
                .collect();
            vm::wait_all(&mut running, self.opts.timeout)?
        };
        for (kernel, _) in &self.guests {
            let console = self.out.join(format!("{}.console", kernel.release));
            if timed_out.contains(&kernel.release) {
                detail(&format!(
                    "{} did not finish within {:?}",
                    kernel.release, self.opts.timeout
                ));
            }
            vm::check_booted(&console, guest::LINE)?;
            rows.push(Row::read(
                kernel.release.clone(),
                Some(kernel),
                &self.out.join(&kernel.release),
            )?);
        }
        let text = report::markdown(&rows);
        std::fs::write(self.out.join("report.md"), &text)?;
        println!("{text}");
        report::failures(&rows, &self.out)
    }
}

/// The provisioner binary the tests exec, and the kernel-level tests' modules in the test
/// binaries that hold them (those whose `module::test` contains one of `only`, all when empty).
fn build(only: &[String]) -> Result<(PathBuf, Vec<TestModule>)> {
    let root = workspace_root();
    let provisioner = crate::test::build_tests_binary()?;
    announce("build", "the kernel-level tests");
    let mut binaries: Vec<&str> = KERNEL_TESTS.iter().map(|(binary, _, _)| *binary).collect();
    binaries.sort_unstable();
    binaries.dedup();
    let mut cmd = cargo("stable");
    cmd.current_dir(&root).args([
        "test",
        "--no-run",
        "--message-format",
        "json-render-diagnostics",
        "-p",
        "provisioner-tests",
    ]);
    for binary in &binaries {
        cmd.args(["--test", binary]);
    }
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the kernel-level tests failed");
    }
    let mut executables = std::collections::BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if let (Some(name), Some(exe)) = (
            message["target"]["name"].as_str(),
            message["executable"].as_str(),
        ) && binaries.contains(&name)
        {
            executables.insert(name.to_owned(), PathBuf::from(exe));
        }
    }
    let mut tests = Vec::new();
    for (binary, module, names) in KERNEL_TESTS {
        let executable = executables
            .get(*binary)
            .with_context(|| format!("cargo built no test binary {binary}"))?;
        let names: Vec<String> = names
            .iter()
            .filter(|n| {
                let path = format!("{module}::{n}");
                only.is_empty() || only.iter().any(|o| path.contains(o.as_str()))
            })
            .map(|n| (*n).to_owned())
            .collect();
        if !names.is_empty() {
            tests.push(TestModule {
                module: (*module).to_owned(),
                executable: executable.clone(),
                names,
            });
        }
    }
    if tests.is_empty() {
        bail!("no kernel-level test matches {only:?}");
    }
    Ok((provisioner, tests))
}

/// The host's runs: its kernel's own backends, then those of older kernels forced.
fn host_rows(
    which: HostRuns,
    out: &Path,
    provisioner: &Path,
    tests: &[TestModule],
) -> Result<Vec<Row>> {
    let host = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_else(|_| "host".into());
    let mut runs = Vec::new();
    if which == HostRuns::Both {
        runs.push((format!("{host} (this host)"), Vec::new()));
    }
    if which != HostRuns::None {
        runs.push((
            format!("{host} (this host, older kernels' backends forced)"),
            vec![(
                testkit::daemon::TRACE_BACKENDS_ENV.to_owned(),
                older_kernels_backends_here(provisioner),
            )],
        ));
    }
    let mut rows = Vec::new();
    for (label, env) in runs {
        announce("matrix", &format!("kernel-level tests on {label}"));
        let dir = out.join(format!("host-{}", rows.len()));
        run_guest(&Plan {
            out: dir.clone(),
            provisioner: provisioner.to_path_buf(),
            tests: tests.to_vec(),
            env: env.clone(),
        })?;
        rows.push(Row::read(label, None, &dir)?);
    }
    Ok(rows)
}

/// [`OLDER_KERNELS_BACKENDS`] without the fentry ones where this kernel refuses fentry (the
/// build machines do, whatever the program), as `provisioner` (`bin`) finds it.
pub fn older_kernels_backends_here(bin: &Path) -> String {
    OLDER_KERNELS_BACKENDS
        .split(',')
        .filter(|c| !c.ends_with("=fentry") || kernel_allows_fentry(bin))
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether this kernel loads the fentry program of the watch (asked of the product itself).
fn kernel_allows_fentry(provisioner: &Path) -> bool {
    let out = Command::new(provisioner)
        .args([
            "trace",
            "--duration",
            "0.1",
            "--verdicts-only",
            "--backend",
            "error_messages=fentry",
        ])
        .output();
    out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("error_messages: fentry"))
}

/// `matrix-guest PLAN`: runs the tests of the plan file.
pub fn guest_main(plan: &Path) -> Result<()> {
    let text = std::fs::read_to_string(plan).with_context(|| format!("read {}", plan.display()))?;
    let plan = Plan::from_text(&text)?;
    // The guest's PATH is vng's; the tests run tools from the usual places.
    // SAFETY: single-threaded at this point; the tests are child processes.
    unsafe {
        std::env::set_var(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        );
    }
    // The guest's /tmp is an overlay of the host's, on which containerd's overlayfs
    // snapshotter cannot mount: the tests' temp dirs go to a tmpfs of the guest's own. It is
    // mounted on a directory of its own, never on /tmp itself, where it would hide the tree
    // (and the binaries the plan names) of a checkout under the host's /tmp.
    let scratch = Path::new("/tmp").join(format!("provisioner-guest-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).with_context(|| format!("create {}", scratch.display()))?;
    nix::mount::mount(
        Some("tmpfs"),
        &scratch,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("mode=1777"),
    )
    .with_context(|| format!("mount a tmpfs on {}", scratch.display()))?;
    // SAFETY: single-threaded at this point; the tests are child processes.
    unsafe {
        std::env::set_var("TMPDIR", &scratch);
    }
    run_guest(&plan).map(drop)
}
