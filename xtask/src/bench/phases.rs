//! The timed phases of the CNI path: the floors, then the three ways interleaved (sequential
//! ADDs then DELs, then concurrent callers), with the hypervisor's steal over each phase.

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::daemon_phase::{Started, seen_created};
use super::proc_stat::CpuTimes;
use super::stats::{Samples, Summary};
use super::ways::{self, Lane, Verb, Way};
use super::{
    Netns, Plugin, QUIET_BEFORE_PHASE, REFERENCE_DIR, floor, plugin_stdin, quiet,
    reference_conflist, sandbox_namespaces,
};
use crate::step::{announce, detail};

/// Calls per way before measuring (first exec, page cache, daemon warm-up).
const WARMUP: usize = 3;
/// Most sandboxes wired by the kernel floor.
const FLOOR_MAX: usize = 200;

/// What no plugin can go below, measured on this machine in this run.
pub struct Floors {
    /// Spawn + exec + wait of `/bin/true`, spawned, fed and reaped exactly like a plugin.
    pub exec: Samples,
    /// The kernel's cost of one ADD's and one DEL's netlink requests ([`floor::kernel`]).
    pub kernel_add: Samples,
    pub kernel_del: Samples,
}

/// The ways' samples per phase, one per lane (reference, plugin, api).
pub struct Ways {
    pub seq_add: Vec<Samples>,
    pub seq_del: Vec<Samples>,
    pub conc_add: Vec<Samples>,
    pub conc_del: Vec<Samples>,
    /// The hypervisor's steal over each phase (in the order above), percent of the CPU time.
    pub steal: [f64; 4],
}

/// The floors, on a quiet node of their own.
pub fn floors(opts: &super::Options) -> Result<Floors> {
    let node = Netns::new("nodefloor")?;
    let n = opts.count.min(FLOOR_MAX);
    let pods = sandbox_namespaces("f", n)?;
    quiet::wait("the floors", QUIET_BEFORE_PHASE)?;
    announce(
        "bench",
        &format!("floor: spawn + exec of /bin/true x{}", opts.count),
    );
    let true_plugin = Plugin {
        bin: PathBuf::from("/bin/true"),
        cni_path: REFERENCE_DIR.to_owned(),
        stdin: b"{}".to_vec(),
        node: &node,
    };
    let lane = [Lane {
        way: Way::Reference(true_plugin),
        pods: &pods,
    }];
    let ids = vec![ways::ids(&lane[0], "t", n)];
    let mut exec = Samples::default();
    for _ in 0..opts.count.div_ceil(n.max(1)) {
        exec.extend(ways::interleaved(&lane, Verb::Add, &ids, 50, 1)?.remove(0));
    }
    detail(&Summary::of(&exec).line());
    announce(
        "bench",
        &format!("floor: the kernel's cost of one ADD's and one DEL's netlink requests x{n}"),
    );
    let (kernel_add, kernel_del) = floor::kernel(&node, &pods)?;
    detail(&format!(
        "ADD requests: {}",
        Summary::of(&kernel_add).line()
    ));
    detail(&format!(
        "DEL requests: {}",
        Summary::of(&kernel_del).line()
    ));
    Ok(Floors {
        exec,
        kernel_add,
        kernel_del,
    })
}

/// The three ways, interleaved: `bins` are provisioner's and the reference's, `node` the
/// provisioner daemon's node namespace.
pub fn ways(
    opts: &super::Options,
    (bin, reference): (&Path, &Path),
    node: &Netns,
    tmp: &Path,
    started: &Started,
) -> Result<Ways> {
    let per_way = opts.count.max(opts.concurrent_count).max(WARMUP);
    let node_ref = Netns::new("noderef")?;
    let pods_ref = sandbox_namespaces("r", per_way)?;
    let pods_plugin = seen_created(&started.daemon, opts, "p", per_way)?;
    let pods_api = seen_created(&started.daemon, opts, "a", per_way)?;
    let reference = Plugin {
        bin: reference.to_path_buf(),
        cni_path: REFERENCE_DIR.to_owned(),
        stdin: plugin_stdin(&reference_conflist(&tmp.join("host-local")))?,
        node: &node_ref,
    };
    let plugin = Plugin {
        bin: bin.to_path_buf(),
        cni_path: REFERENCE_DIR.to_owned(),
        stdin: plugin_stdin(&started.conflist)?,
        node,
    };
    let lanes = [
        Lane {
            way: Way::Reference(reference),
            pods: &pods_ref,
        },
        Lane {
            way: Way::Plugin(plugin, &started.daemon),
            pods: &pods_plugin,
        },
        Lane {
            way: Way::Api(&started.daemon),
            pods: &pods_api,
        },
    ];
    warm_up(&lanes)?;
    let (n, m, block) = (opts.count, opts.concurrent_count, opts.block);
    quiet::wait("the sequential phases", QUIET_BEFORE_PHASE)?;
    let (seq_add, steal_seq_add) = phase(&lanes, Verb::Add, "s", n, block, 1)?;
    let (seq_del, steal_seq_del) = phase(&lanes, Verb::Del, "s", n, block, 1)?;
    ways::settle(&node_ref)?;
    ways::settle(node)?;
    quiet::wait("the concurrent phases", QUIET_BEFORE_PHASE)?;
    let (conc_add, steal_conc_add) = phase(&lanes, Verb::Add, "c", m, 4 * block, opts.concurrency)?;
    let (conc_del, steal_conc_del) = phase(&lanes, Verb::Del, "c", m, 4 * block, opts.concurrency)?;
    ways::settle(&node_ref)?;
    ways::settle(node)?;
    Ok(Ways {
        seq_add,
        seq_del,
        conc_add,
        conc_del,
        steal: [steal_seq_add, steal_seq_del, steal_conc_add, steal_conc_del],
    })
}

/// Warms every lane up (first exec, page cache, the daemon's first sandbox): ADD then DEL of
/// [`WARMUP`] sandboxes with ids of their own, in the first pods.
fn warm_up(lanes: &[Lane]) -> Result<()> {
    for lane in lanes {
        let ids = [ways::ids(lane, "w", WARMUP)];
        for verb in [Verb::Add, Verb::Del] {
            ways::interleaved(std::slice::from_ref(lane), verb, &ids, WARMUP, 1)?;
        }
    }
    Ok(())
}

/// Runs one interleaved phase of every lane and prints a line per lane; returns the samples
/// per lane and the hypervisor's steal over the phase (percent of the CPU time).
fn phase(
    lanes: &[Lane],
    verb: Verb,
    tag: &str,
    n: usize,
    block: usize,
    workers: usize,
) -> Result<(Vec<Samples>, f64)> {
    let what = if workers > 1 {
        format!("{workers} concurrent callers")
    } else {
        "sequential".into()
    };
    let names: Vec<&str> = lanes.iter().map(|l| l.way.name()).collect();
    announce(
        "bench",
        &format!(
            "{what}: {verb:?} x{n} per way, interleaved in blocks of {block} ({})",
            names.join(", ")
        ),
    );
    let ids: Vec<Vec<String>> = lanes.iter().map(|l| ways::ids(l, tag, n)).collect();
    let before = CpuTimes::now()?;
    let out = ways::interleaved(lanes, verb, &ids, block, workers)?;
    let cpu = CpuTimes::now()?.since(&before);
    for (name, samples) in names.iter().zip(&out) {
        detail(&format!("{name:<9} {}", Summary::of(samples).line()));
    }
    detail(&format!(
        "CPUs: {:.0}% busy, hypervisor steal {:.1}%",
        cpu.not_idle_percent() - cpu.steal_percent(),
        cpu.steal_percent()
    ));
    Ok((out, cpu.steal_percent()))
}
