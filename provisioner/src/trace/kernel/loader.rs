//! Loading the eBPF programs and attaching, per observation, the backend this kernel offers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aya::maps::{HashMap as BpfHashMap, PerCpuArray, RingBuf};
use aya::programs::{BtfTracePoint, FEntry, TracePoint};
use aya::{Btf, Ebpf, EbpfLoader};
use provisioner_common::kind;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use super::backends::{
    ALWAYS, Attach, Backend, BackendChoices, Candidate, Observation, ObservationStatus, candidates,
};
use super::btf::{KernelBtf, KernelOffsets};
use super::kernel_fs;
use super::netns_ids::{NetnsIds, kernel_gives_cookies};
use super::ring::{BATCH, EventBatch, LossCounters, RingUsage, SpareBatches, read_ring};
use crate::trace::TraceError;

pub(in crate::trace) static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(env!("PROVISIONER_EBPF_OBJECT"));

/// Size of the kernel-to-user ring buffer. Mapping it makes all of it resident in the daemon
/// at once, twice over (its data pages are mapped twice so that a record can wrap around): 2 MiB
/// are 4 MiB of the daemon's RSS. Overflow is counted (`trace_lost_events_total`), never
/// silent, and no alarm rests on what was lost: a sandbox's state is read from the kernel
/// before it is judged anything but networked.
const EVENTS_BYTES: u32 = 2 * 1024 * 1024;

/// What the running kernel let the watch attach.
#[derive(Clone, Debug)]
pub struct Attached {
    /// What each observation runs on, in [`Observation::ALL`]'s order.
    pub observations: Vec<ObservationStatus>,
    /// How this run names namespaces.
    pub ids: NetnsIds,
}

impl Attached {
    /// The backend of `observation`, if it has one.
    pub fn backend(&self, observation: Observation) -> Option<Backend> {
        self.observations
            .iter()
            .find(|s| s.observation == observation)
            .and_then(|s| s.backend)
    }
}

/// The loaded and attached programs; detached when dropped.
pub struct KernelTracer {
    ebpf: Ebpf,
    decode_failures: Arc<Vec<AtomicU64>>,
    backlog_peak: Arc<AtomicU64>,
    attached: Attached,
    spare_batches: SpareBatches,
}

impl KernelTracer {
    /// Loads the programs, attaches for each observation the first backend this kernel offers
    /// (or the one `choices` names) and starts reading events on the current tokio runtime;
    /// the events come in batches, about `channel_capacity` of them buffered at most. Fails
    /// only when the kernel cannot run the watch at all (no BTF, no ring buffer, a member every
    /// program reads); an observation without a backend is reported in [`Self::attached`].
    ///
    /// Needs root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN for tracefs/bpffs mounts).
    pub fn start(
        channel_capacity: usize,
        choices: &BackendChoices,
    ) -> Result<(Self, mpsc::Receiver<EventBatch>), TraceError> {
        if !cfg!(target_arch = "x86_64") {
            return Err(TraceError::UnsupportedArch(std::env::consts::ARCH));
        }
        let kernel = KernelBtf::read()?;
        let ids_backend =
            choices
                .get(Observation::NamespaceIds)
                .unwrap_or(if kernel_gives_cookies() {
                    Backend::KernelCookie
                } else {
                    Backend::InodeGeneration
                });
        let (mut ebpf, offsets) = load_object(&kernel, ids_backend)?;
        let btf = Btf::from_sys_fs()?;
        for attach in ALWAYS {
            attach_program(&mut ebpf, &btf, attach).map_err(|(_, err)| err)?;
        }
        let mut observations = Vec::with_capacity(Observation::ALL.len());
        for observation in Observation::ALL {
            let status = if observation == Observation::NamespaceIds {
                ObservationStatus {
                    observation,
                    backend: Some(ids_backend),
                    detail: ids_backend.cost().to_owned(),
                }
            } else {
                attach_observation(&mut ebpf, &btf, &kernel, &offsets, observation, choices)
            };
            if status.backend.is_none() {
                tracing::warn!(observation = %observation, reason = %status.detail, "the kernel watch runs without this observation");
            }
            observations.push(status);
        }
        let ids = match ids_backend {
            Backend::InodeGeneration => NetnsIds::inode_generations(
                take_map(&mut ebpf, "NETNS_GENERATIONS").and_then(|map| {
                    BpfHashMap::try_from(map).map_err(|e| TraceError::Map {
                        map: "NETNS_GENERATIONS",
                        reason: e.to_string(),
                    })
                })?,
            ),
            _ => NetnsIds::kernel_cookies(),
        };
        let ring =
            RingBuf::try_from(take_map(&mut ebpf, "EVENTS")?).map_err(|e| TraceError::Map {
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
                attached: Attached { observations, ids },
                spare_batches,
            },
            rx,
        ))
    }

    /// Hands a batch the caller is done with back to the ring reader, to be filled again.
    pub fn recycle(&self, batch: EventBatch) {
        self.spare_batches.give_back(batch);
    }

    /// What each observation runs on, and how namespaces are named.
    pub fn attached(&self) -> &Attached {
        &self.attached
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

/// What [`check_every_backend`] found for one program.
#[derive(Debug)]
pub struct ProgramCheck {
    pub observation: Observation,
    pub backend: Backend,
    pub program: &'static str,
    /// `Ok` when this kernel loaded it; `Err(None)` when the kernel does not offer its
    /// attach point; `Err(Some(error))` when it refused it.
    pub outcome: Result<(), Option<String>>,
}

/// Loads the program of every backend of every observation whose attach point this kernel
/// offers, without attaching it: whether the verifier takes the programs of backends this
/// kernel's probe would not pick. Everything is unloaded when it returns.
pub fn check_every_backend() -> Result<Vec<ProgramCheck>, TraceError> {
    let kernel = KernelBtf::read()?;
    let (mut ebpf, _) = load_object(&kernel, Backend::InodeGeneration)?;
    let btf = Btf::from_sys_fs()?;
    let mut checks = Vec::new();
    for observation in Observation::ALL {
        for candidate in candidates(observation) {
            for attach in candidate.programs {
                let outcome = match available(&kernel, attach) {
                    Err(_) => Err(None),
                    Ok(()) => load_program(&mut ebpf, &btf, attach).map_err(|(_, err)| {
                        Some(format!("{err}: {:?}", std::error::Error::source(&err)))
                    }),
                };
                checks.push(ProgramCheck {
                    observation,
                    backend: candidate.backend,
                    program: attach.program(),
                    outcome,
                });
            }
        }
    }
    Ok(checks)
}

/// The first of `observation`'s backends (only the chosen one, when `choices` names one) that
/// this kernel has and that loads and attaches; the status says which, or why none.
fn attach_observation(
    ebpf: &mut Ebpf,
    btf: &Btf,
    kernel: &KernelBtf,
    offsets: &KernelOffsets,
    observation: Observation,
    choices: &BackendChoices,
) -> ObservationStatus {
    let chosen = choices.get(observation);
    let mut refusals = Vec::new();
    for candidate in candidates(observation)
        .iter()
        .filter(|c| chosen.is_none_or(|b| b == c.backend))
    {
        match attach_candidate(ebpf, btf, kernel, offsets, candidate) {
            Ok(()) => {
                return ObservationStatus {
                    observation,
                    backend: Some(candidate.backend),
                    detail: candidate.backend.cost().to_owned(),
                };
            }
            Err(why) => refusals.push(format!("{}: {why}", candidate.backend)),
        }
    }
    ObservationStatus {
        observation,
        backend: None,
        detail: refusals.join("; "),
    }
}

/// Attaches every program of `candidate`, or none of them: on a failure the ones attached are
/// unloaded again.
fn attach_candidate(
    ebpf: &mut Ebpf,
    btf: &Btf,
    kernel: &KernelBtf,
    offsets: &KernelOffsets,
    candidate: &Candidate,
) -> Result<(), String> {
    if let Some(missing) = offsets.lacking(candidate.members) {
        return Err(format!("kernel BTF has no member {missing}"));
    }
    for attach in candidate.programs {
        available(kernel, attach)?;
    }
    for (done, attach) in candidate.programs.iter().enumerate() {
        if let Err((_, err)) = attach_program(ebpf, btf, attach) {
            for attached in &candidate.programs[..=done] {
                unload_program(ebpf, attached);
            }
            return Err(err.to_string());
        }
    }
    Ok(())
}

/// Whether this kernel has the attach point of `attach`.
fn available(kernel: &KernelBtf, attach: &Attach) -> Result<(), String> {
    match attach {
        Attach::BtfTracepoint { tracepoint, .. } => kernel
            .has_tracepoint(tracepoint)
            .then_some(())
            .ok_or_else(|| format!("no {tracepoint} tracepoint")),
        Attach::Tracepoint { category, name, .. } => kernel_fs::has_tracepoint(category, name)
            .then_some(())
            .ok_or_else(|| format!("no {category}/{name} tracepoint")),
        Attach::Fentry { function, .. } => kernel
            .has_function(function)
            .then_some(())
            .ok_or_else(|| format!("no function {function} in the kernel's BTF")),
    }
}

/// An error and whether it came from attaching (the program was loaded).
type ProgramFailure = (bool, TraceError);

fn load_program(ebpf: &mut Ebpf, btf: &Btf, attach: &Attach) -> Result<(), ProgramFailure> {
    let program = attach.program();
    let failed = |source| {
        (
            false,
            TraceError::Program {
                program,
                action: "load",
                source,
            },
        )
    };
    match attach {
        Attach::BtfTracepoint { tracepoint, .. } => program_mut::<BtfTracePoint>(ebpf, program)
            .map_err(|e| (false, e))?
            .load(tracepoint, btf)
            .map_err(failed),
        Attach::Tracepoint { .. } => program_mut::<TracePoint>(ebpf, program)
            .map_err(|e| (false, e))?
            .load()
            .map_err(failed),
        Attach::Fentry { function, .. } => program_mut::<FEntry>(ebpf, program)
            .map_err(|e| (false, e))?
            .load(function, btf)
            .map_err(failed),
    }
}

fn attach_program(ebpf: &mut Ebpf, btf: &Btf, attach: &Attach) -> Result<(), ProgramFailure> {
    load_program(ebpf, btf, attach)?;
    let program = attach.program();
    let failed = |source| {
        (
            true,
            TraceError::Program {
                program,
                action: "attach",
                source,
            },
        )
    };
    match attach {
        Attach::BtfTracepoint { .. } => program_mut::<BtfTracePoint>(ebpf, program)
            .map_err(|e| (true, e))?
            .attach()
            .map(drop)
            .map_err(failed),
        Attach::Tracepoint { category, name, .. } => program_mut::<TracePoint>(ebpf, program)
            .map_err(|e| (true, e))?
            .attach(category, name)
            .map(drop)
            .map_err(failed),
        Attach::Fentry { .. } => program_mut::<FEntry>(ebpf, program)
            .map_err(|e| (true, e))?
            .attach()
            .map(drop)
            .map_err(failed),
    }
}

/// Detaches and unloads the program of `attach` (a backend given up half way).
fn unload_program(ebpf: &mut Ebpf, attach: &Attach) {
    let program = attach.program();
    let unloaded = match attach {
        Attach::BtfTracepoint { .. } => {
            program_mut::<BtfTracePoint>(ebpf, program).map(|p| p.unload().is_ok())
        }
        Attach::Tracepoint { .. } => {
            program_mut::<TracePoint>(ebpf, program).map(|p| p.unload().is_ok())
        }
        Attach::Fentry { .. } => program_mut::<FEntry>(ebpf, program).map(|p| p.unload().is_ok()),
    };
    if !matches!(unloaded, Ok(true)) {
        tracing::debug!(program, "program of a backend given up was not loaded");
    }
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, TraceError> {
    ebpf.take_map(name).ok_or(TraceError::Map {
        map: name,
        reason: "not in the object".into(),
    })
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

/// The embedded object with the running kernel's offsets and the namespace naming of
/// `ids` patched in, its maps created; no program loaded yet.
fn load_object(kernel: &KernelBtf, ids: Backend) -> Result<(Ebpf, KernelOffsets), TraceError> {
    check_abi(EBPF_OBJECT)?;
    kernel_fs::ensure_mounted()?;
    let offsets = KernelOffsets::from_kernel(kernel)?;
    let from_inodes = u32::from(ids == Backend::InodeGeneration);
    let mut loader = EbpfLoader::new();
    for (global, value) in &offsets.values {
        loader.override_global(global, value, true);
    }
    loader.override_global("NETNS_IDS_FROM_INODES", &from_inodes, true);
    loader.map_max_entries("EVENTS", EVENTS_BYTES);
    if ids != Backend::InodeGeneration {
        // Preallocated: one entry where nothing uses it.
        loader.map_max_entries("NETNS_GENERATIONS", 1);
    }
    let ebpf = loader.load(EBPF_OBJECT).map_err(TraceError::from_load)?;
    Ok((ebpf, offsets))
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
