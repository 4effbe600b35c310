//! Loading and attaching the eBPF programs, and reading their ring buffer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

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

pub(super) static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("PROVISIONER_EBPF_OBJECT"));

/// Syscall tracepoints: (program, category, name). Any of them puts every syscall of the node
/// on the slow path, so they are attached only where `cap_capable` is missing (kernels before
/// 6.14).
const SYSCALL_FALLBACK: &[(&str, &str, &str)] = &[
    ("sys_enter_unshare", "syscalls", "sys_enter_unshare"),
    ("sys_exit_unshare", "syscalls", "sys_exit_unshare"),
    ("sys_enter_mount", "syscalls", "sys_enter_mount"),
];

/// The BTF tracepoint that sees unshare and mount at their CAP_SYS_ADMIN check.
const CAP_CAPABLE: &str = "cap_capable";

/// BTF tracepoints: (program, tracepoint).
const BTF_TRACEPOINTS: &[(&str, &str)] = &[
    ("task_newtask", "task_newtask"),
    ("sched_process_exit", "sched_process_exit"),
    ("netlink_extack", "netlink_extack"),
    ("qdisc_create", "qdisc_create"),
    ("qdisc_destroy", "qdisc_destroy"),
    ("sched_process_exec", "sched_process_exec"),
    ("sock_send_length", "sock_send_length"),
    ("sock_recv_length", "sock_recv_length"),
];

/// Size of the kernel-to-user ring buffer. Mapping it makes all of it resident in the daemon
/// at once, twice over (its data pages are mapped twice so that a record can wrap around): 2 MiB
/// are 4 MiB of the daemon's RSS. The largest backlog measured, 16 concurrent ADDs on a loaded
/// 2-core node, was 0.6-1.0 MiB (`trace_ring_backlog_peak_bytes`). Overflow is counted
/// (`trace_lost_events_total`), never silent, and no alarm rests on what was lost: a sandbox's
/// state is read from the kernel before it is judged anything but networked.
const EVENTS_BYTES: u32 = 2 * 1024 * 1024;

/// Events decoded from the ring, in order, handed to the driver together: one channel send
/// and one turn of the driver's loop per batch rather than per event.
pub type EventBatch = Vec<TraceEvent>;

/// Most events in a batch (a drain under ADDs holds hundreds).
const BATCH: usize = 256;

/// Bytes a record takes in the ring: an 8-byte header, the data rounded up to 8.
fn ring_footprint(record_len: usize) -> u64 {
    8 + record_len.next_multiple_of(8) as u64
}

/// How often the ring buffer is drained when records do not wake the reader (they do once
/// 256 KiB are unread): the most a kernel event waits before the correlator sees it.
const DRAIN_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

/// Events that did not reach userspace or could not be decoded, per record kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LossCounters {
    /// Ring-buffer reservations that failed in the kernel (buffer full), per kind.
    pub reserve_failures: Vec<(u32, u64)>,
    /// Records userspace could not decode, per kind.
    pub decode_failures: Vec<(u32, u64)>,
    /// Records not sent because the task's network namespace could not be read, per kind.
    pub netns_unreadable: Vec<(u32, u64)>,
}

impl LossCounters {
    pub fn total(&self) -> u64 {
        self.reserve_failures
            .iter()
            .chain(&self.decode_failures)
            .chain(&self.netns_unreadable)
            .map(|(_, n)| n)
            .sum()
    }
}

/// How unshare and bind mounts are seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NamespaceHooks {
    /// At their CAP_SYS_ADMIN check (`cap_capable`): no cost to other syscalls.
    CapCapable,
    /// Syscall tracepoints: every syscall of the node takes the slow path.
    SyscallTracepoints,
}

/// The loaded and attached programs; detached when dropped.
pub struct KernelTracer {
    ebpf: Ebpf,
    decode_failures: Arc<Vec<AtomicU64>>,
    backlog_peak: Arc<AtomicU64>,
    hooks: NamespaceHooks,
    spare_batches: SpareBatches,
}

/// Emptied batches handed back by the driver for the ring reader to fill again. A batch is
/// tens of KiB, allocated at every drain and freed after it otherwise: pages the daemon's
/// allocator may give back to the kernel and fault in again, each time with a TLB flush on
/// every CPU the daemon runs on (see `memory::by_role`).
#[derive(Clone, Default)]
struct SpareBatches(Arc<Mutex<Vec<EventBatch>>>);

/// Spare batches kept (a burst that needed more frees the rest).
const SPARE_BATCHES: usize = 4;

impl SpareBatches {
    fn take(&self) -> EventBatch {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(BATCH))
    }

    fn give_back(&self, mut batch: EventBatch) {
        batch.clear();
        let mut spares = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if spares.len() < SPARE_BATCHES && batch.capacity() == BATCH {
            spares.push(batch);
        }
    }
}

/// The ring buffer's size and the most it held unread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RingUsage {
    pub bytes: u64,
    /// The most bytes drained at once since the start.
    pub backlog_peak_bytes: u64,
}

impl KernelTracer {
    /// Loads the programs, attaches them and starts reading events on the current tokio runtime;
    /// the events come in batches, about `channel_capacity` of them buffered at most.
    ///
    /// Needs root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN for tracefs/bpffs mounts).
    pub fn start(
        channel_capacity: usize,
    ) -> Result<(Self, mpsc::Receiver<EventBatch>), TraceError> {
        if !cfg!(target_arch = "x86_64") {
            return Err(TraceError::UnsupportedArch(std::env::consts::ARCH));
        }
        let mut ebpf = load_object()?;
        let btf = Btf::from_sys_fs()?;
        for (program, tracepoint) in BTF_TRACEPOINTS {
            attach_btf(&mut ebpf, &btf, program, tracepoint)?;
        }
        let hooks = match attach_btf(&mut ebpf, &btf, CAP_CAPABLE, CAP_CAPABLE) {
            Ok(()) => NamespaceHooks::CapCapable,
            Err(err) => {
                tracing::warn!(error = %err, "no cap_capable tracepoint: unshare and mount are traced with syscall tracepoints, which slow every syscall of the node");
                load_syscall_programs(&mut ebpf)?;
                for (program, category, name) in SYSCALL_FALLBACK {
                    let prog: &mut TracePoint = program_mut(&mut ebpf, program)?;
                    prog.attach(category, name)
                        .map_err(|source| TraceError::Program {
                            program,
                            action: "attach",
                            source,
                        })?;
                }
                NamespaceHooks::SyscallTracepoints
            }
        };
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
        let backlog_peak = Arc::new(AtomicU64::new(0));
        let (tx, rx) = mpsc::channel((channel_capacity / BATCH).max(1));
        let spare_batches = SpareBatches::default();
        tokio::spawn(read_ring(
            ring,
            tx,
            spare_batches.clone(),
            Arc::clone(&decode_failures),
            Arc::clone(&backlog_peak),
        ));
        Ok((
            Self {
                ebpf,
                decode_failures,
                backlog_peak,
                hooks,
                spare_batches,
            },
            rx,
        ))
    }

    /// Hands a batch the caller is done with back to the ring reader, to be filled again.
    pub fn recycle(&self, batch: EventBatch) {
        self.spare_batches.give_back(batch);
    }

    /// How unshare and bind mounts are seen on this kernel.
    pub fn namespace_hooks(&self) -> NamespaceHooks {
        self.hooks
    }

    /// Events lost so far, per kind.
    pub fn loss_counters(&self) -> LossCounters {
        let mut counters = LossCounters {
            reserve_failures: self.per_kind("LOST"),
            netns_unreadable: self.per_kind("NETNS_UNREADABLE"),
            ..LossCounters::default()
        };
        for (k, n) in self.decode_failures.iter().enumerate() {
            let n = n.load(Ordering::Relaxed);
            if n > 0 {
                counters.decode_failures.push((k as u32, n));
            }
        }
        counters
    }

    pub fn ring_usage(&self) -> RingUsage {
        RingUsage {
            bytes: u64::from(EVENTS_BYTES),
            backlog_peak_bytes: self.backlog_peak.load(Ordering::Relaxed),
        }
    }
}

impl KernelTracer {
    /// The non-zero per-kind counters of the per-CPU array `map`, summed over CPUs.
    fn per_kind(&self, map: &str) -> Vec<(u32, u64)> {
        let Some(map) = self.ebpf.map(map) else {
            return Vec::new();
        };
        let Ok(counters) = PerCpuArray::<_, u64>::try_from(map) else {
            return Vec::new();
        };
        (0..kind::COUNT)
            .filter_map(|k| {
                let n: u64 = counters.get(&k, 0).map(|v| v.iter().sum()).unwrap_or(0);
                (n > 0).then_some((k, n))
            })
            .collect()
    }
}

/// Refuses an object whose records do not have this binary's layout (it would decode garbage).
fn check_abi(object: &[u8]) -> Result<(), TraceError> {
    let expected = provisioner_common::abi_tag();
    let marker = provisioner_common::ABI_MARKER;
    let found = object
        .windows(expected.len())
        .find(|w| w.starts_with(marker))
        .map(|w| String::from_utf8_lossy(&w[marker.len()..]).into_owned());
    let expected = String::from_utf8_lossy(&expected[marker.len()..]).into_owned();
    match found {
        Some(object) if object == expected => Ok(()),
        Some(object) => Err(TraceError::AbiMismatch { object, expected }),
        None => Err(TraceError::AbiMismatch {
            object: "unknown (no ABI tag: built before the check existed)".to_owned(),
            expected,
        }),
    }
}

fn attach_btf(
    ebpf: &mut Ebpf,
    btf: &Btf,
    program: &'static str,
    tracepoint: &str,
) -> Result<(), TraceError> {
    let prog: &mut BtfTracePoint = program_mut(ebpf, program)?;
    prog.load(tracepoint, btf)
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
    Ok(())
}

/// The embedded object with the running kernel's offsets patched in, its maps created; no
/// program loaded yet.
fn load_object() -> Result<Ebpf, TraceError> {
    check_abi(EBPF_OBJECT)?;
    kernel_fs::ensure_mounted()?;
    let offsets = KernelOffsets::from_running_kernel()?;
    let mut loader = EbpfLoader::new();
    for (global, value) in &offsets.values {
        loader.override_global(global, value, true);
    }
    loader.map_max_entries("EVENTS", EVENTS_BYTES);
    Ok(loader.load(EBPF_OBJECT)?)
}

/// Loads the syscall tracepoint programs into the kernel without attaching them, and unloads
/// them: whether the verifier takes them here, where [`KernelTracer::start`] uses
/// `cap_capable` instead and never loads them.
pub fn load_syscall_fallback() -> Result<(), TraceError> {
    load_syscall_programs(&mut load_object()?)
}

/// Loads the syscall tracepoint programs into the kernel (not attached).
fn load_syscall_programs(ebpf: &mut Ebpf) -> Result<(), TraceError> {
    for (program, _, _) in SYSCALL_FALLBACK {
        let prog: &mut TracePoint = program_mut(ebpf, program)?;
        prog.load().map_err(|source| TraceError::Program {
            program,
            action: "load",
            source,
        })?;
    }
    Ok(())
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
    tx: mpsc::Sender<EventBatch>,
    spare_batches: SpareBatches,
    decode_failures: Arc<Vec<AtomicU64>>,
    backlog_peak: Arc<AtomicU64>,
) {
    let clock = Clock::new();
    let mut drain = tokio::time::interval(DRAIN_EVERY);
    drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Records wake the reader only once the buffer fills up (see WAKEUP_BYTES in the eBPF
        // programs): below that, it is drained on a timer.
        tokio::select! {
            guard = ring.readable_mut() => match guard {
                // Cleared before draining: a record submitted meanwhile is drained below.
                Ok(mut guard) => guard.clear_ready(),
                Err(_) => {
                    tracing::error!("ring buffer poll failed; kernel tracing stopped");
                    return;
                }
            },
            _ = drain.tick() => {}
        }
        let ring = ring.get_mut();
        let mut drained = 0;
        let mut batch = EventBatch::new();
        while let Some(item) = ring.next() {
            drained += ring_footprint(item.len());
            let decoded = decode(&item, &clock);
            drop(item);
            match decoded {
                Ok(event) => {
                    if batch.capacity() == 0 {
                        batch = spare_batches.take();
                    }
                    batch.push(event);
                    if batch.len() == BATCH && tx.send(std::mem::take(&mut batch)).await.is_err() {
                        return;
                    }
                }
                Err(err) => {
                    if let Some(counter) = decode_failures.get(err.kind() as usize) {
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::debug!(error = %err, "undecodable kernel record");
                }
            }
        }
        if !batch.is_empty() && tx.send(batch).await.is_err() {
            return;
        }
        backlog_peak.fetch_max(drained, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_object_has_this_binarys_layout() {
        assert!(
            check_abi(EBPF_OBJECT).is_ok(),
            "{:?}",
            check_abi(EBPF_OBJECT)
        );
    }

    #[test]
    fn an_object_with_another_layout_is_refused_naming_both() {
        let mut object = b"...".to_vec();
        object.extend_from_slice(provisioner_common::ABI_MARKER);
        object.extend_from_slice(b"0123456789abcdef...");
        let err = check_abi(&object).expect_err("other layout");
        let text = err.to_string();
        assert!(text.contains("0123456789abcdef"), "{text}");
        assert!(text.contains("cargo xtask build-ebpf"), "{text}");
        assert!(check_abi(b"no tag here").is_err());
    }
}
