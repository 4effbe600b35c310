//! Loading and attaching the eBPF programs, and reading their ring buffer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aya::maps::{MapData, PerCpuArray, RingBuf};
use aya::programs::{BtfTracePoint, TracePoint};
use aya::{Btf, Ebpf, EbpfLoader};
use provisioner_common::kind;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use super::TraceError;
use super::btf_offsets::KernelOffsets;
use super::events::{Clock, TraceEvent, decode};
use super::kernel_fs;

static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("PROVISIONER_EBPF_OBJECT"));

/// Syscall tracepoints: (program, category, name).
const TRACEPOINTS: &[(&str, &str, &str)] = &[
    ("sys_enter_unshare", "syscalls", "sys_enter_unshare"),
    ("sys_exit_unshare", "syscalls", "sys_exit_unshare"),
    ("sys_enter_mount", "syscalls", "sys_enter_mount"),
];

/// BTF tracepoints: (program, tracepoint).
const BTF_TRACEPOINTS: &[(&str, &str)] = &[
    ("task_newtask", "task_newtask"),
    ("netlink_extack", "netlink_extack"),
    ("qdisc_create", "qdisc_create"),
    ("qdisc_destroy", "qdisc_destroy"),
    ("sched_process_exec", "sched_process_exec"),
    ("sock_send_length", "sock_send_length"),
    ("sock_recv_length", "sock_recv_length"),
];

/// Size of the kernel-to-user ring buffer. Its pages become resident in the daemon as they are
/// read, so it is the largest part of the daemon's memory; 4 MiB holds ~10k netlink records
/// (a burst of hundreds of sandbox setups) and overflow is counted, never silent.
const EVENTS_BYTES: u32 = 4 * 1024 * 1024;

/// Events that did not reach userspace or could not be decoded, per record kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LossCounters {
    /// Ring-buffer reservations that failed in the kernel (buffer full), per kind.
    pub reserve_failures: Vec<(u32, u64)>,
    /// Records userspace could not decode, per kind.
    pub decode_failures: Vec<(u32, u64)>,
}

impl LossCounters {
    pub fn total(&self) -> u64 {
        self.reserve_failures
            .iter()
            .chain(&self.decode_failures)
            .map(|(_, n)| n)
            .sum()
    }
}

/// The loaded and attached programs; detached when dropped.
pub struct KernelTracer {
    ebpf: Ebpf,
    decode_failures: Arc<Vec<AtomicU64>>,
}

impl KernelTracer {
    /// Loads the programs, attaches them and starts reading events on the current tokio runtime.
    ///
    /// Needs root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN for tracefs/bpffs mounts).
    pub fn start(
        channel_capacity: usize,
    ) -> Result<(Self, mpsc::Receiver<TraceEvent>), TraceError> {
        kernel_fs::ensure_mounted()?;
        let offsets = KernelOffsets::from_running_kernel()?;
        let mut loader = EbpfLoader::new();
        for (global, value) in &offsets.values {
            loader.override_global(global, value, true);
        }
        loader.map_max_entries("EVENTS", EVENTS_BYTES);
        let mut ebpf = loader.load(EBPF_OBJECT)?;
        for (program, category, name) in TRACEPOINTS {
            let prog: &mut TracePoint = program_mut(&mut ebpf, program)?;
            prog.load().map_err(|source| TraceError::Program {
                program,
                action: "load",
                source,
            })?;
            prog.attach(category, name)
                .map_err(|source| TraceError::Program {
                    program,
                    action: "attach",
                    source,
                })?;
        }
        let btf = Btf::from_sys_fs()?;
        for (program, tracepoint) in BTF_TRACEPOINTS {
            let prog: &mut BtfTracePoint = program_mut(&mut ebpf, program)?;
            prog.load(tracepoint, &btf)
                .map_err(|source| TraceError::Program {
                    program,
                    action: "load",
                    source,
                })?;
            prog.attach().map_err(|source| TraceError::Program {
                program,
                action: "attach",
                source,
            })?;
        }
        let events = ebpf.take_map("EVENTS").ok_or(TraceError::Map {
            map: "EVENTS",
            reason: "not in the object".into(),
        })?;
        let ring = RingBuf::try_from(events).map_err(|e| TraceError::Map {
            map: "EVENTS",
            reason: e.to_string(),
        })?;
        // SAFETY: the RingBuf owns its map fd, which stays open as long as the AsyncFd owns it.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| TraceError::Poll(e.into()))?;
        let decode_failures: Arc<Vec<AtomicU64>> =
            Arc::new((0..kind::COUNT).map(|_| AtomicU64::new(0)).collect());
        let (tx, rx) = mpsc::channel(channel_capacity);
        tokio::spawn(read_ring(ring, tx, Arc::clone(&decode_failures)));
        Ok((
            Self {
                ebpf,
                decode_failures,
            },
            rx,
        ))
    }

    /// Events lost so far, per kind.
    pub fn loss_counters(&self) -> LossCounters {
        let mut counters = LossCounters::default();
        if let Some(map) = self.ebpf.map("LOST")
            && let Ok(lost) = PerCpuArray::<_, u64>::try_from(map)
        {
            for k in 0..kind::COUNT {
                let n: u64 = lost.get(&k, 0).map(|v| v.iter().sum()).unwrap_or(0);
                if n > 0 {
                    counters.reserve_failures.push((k, n));
                }
            }
        }
        for (k, n) in self.decode_failures.iter().enumerate() {
            let n = n.load(Ordering::Relaxed);
            if n > 0 {
                counters.decode_failures.push((k as u32, n));
            }
        }
        counters
    }
}

fn program_mut<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, TraceError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program>,
{
    let program = ebpf.program_mut(name).ok_or(TraceError::Map {
        map: "programs",
        reason: format!("program {name} is not in the object"),
    })?;
    program.try_into().map_err(|_| TraceError::Map {
        map: "programs",
        reason: format!("program {name} has an unexpected type"),
    })
}

async fn read_ring(
    mut ring: AsyncFd<RingBuf<MapData>>,
    tx: mpsc::Sender<TraceEvent>,
    decode_failures: Arc<Vec<AtomicU64>>,
) {
    let clock = Clock::new();
    loop {
        let Ok(mut guard) = ring.readable_mut().await else {
            tracing::error!("ring buffer poll failed; kernel tracing stopped");
            return;
        };
        let ring = guard.get_inner_mut();
        let mut batch = Vec::new();
        while let Some(item) = ring.next() {
            match decode(&item, &clock) {
                Ok(event) => batch.push(event),
                Err(err) => {
                    if let Some(counter) = decode_failures.get(err.kind() as usize) {
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::debug!(error = %err, "undecodable kernel record");
                }
            }
        }
        guard.clear_ready();
        for event in batch {
            if tx.send(event).await.is_err() {
                return;
            }
        }
    }
}
