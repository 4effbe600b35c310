//! Reading the ring buffer the programs write: records decoded in batches, what could not be
//! sent or decoded counted per kind.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use super::events::{Clock, TraceEvent, decode};

/// Events decoded from the ring, in order, handed to the driver together: one channel send
/// and one turn of the driver's loop per batch rather than per event.
pub type EventBatch = Vec<TraceEvent>;

/// Most events in a batch (a drain under ADDs holds hundreds).
pub(super) const BATCH: usize = 256;

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

/// Emptied batches handed back by the driver for the ring reader to fill again. A batch is
/// tens of KiB, allocated at every drain and freed after it otherwise: pages the daemon's
/// allocator may give back to the kernel and fault in again, each time with a TLB flush on
/// every CPU the daemon runs on (see `memory`).
#[derive(Clone, Default)]
pub(super) struct SpareBatches(Arc<Mutex<Vec<EventBatch>>>);

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

    pub(super) fn give_back(&self, mut batch: EventBatch) {
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

pub(super) async fn read_ring(
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
