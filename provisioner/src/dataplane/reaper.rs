//! The background reaper: deletes retired host links off the DEL path.
//!
//! Deleting a veth costs the kernel ~24 ms of RCU grace periods, spent inside the `sendmsg` of
//! the RTM_DELLINK. Teardown therefore only *retires* the host veth (withdraws every address and
//! route through it, sets it down and moves it to [`GRAVEYARD_GROUP`], once both ends are done
//! with) and queues it here. The reaper runs on a thread of its own (the blocking kernel call
//! never stalls a tokio worker nor the shared host socket) with its own socket in the host
//! netns; per batch it deletes the whole group with one request: the grace periods are paid
//! once for every link retired meanwhile. Only a finished teardown puts a link in the group, so
//! a group deletion never takes a pair whose teardown is still running.
//!
//! A link retired while the reaper is idle is deleted at once (a lone DEL's pair is gone from
//! both namespaces within milliseconds). Under a stream of retirements (a
//! batch ended less than [`GATHER_WINDOW`] ago) a batch gathers the links retired within
//! [`GATHER_WINDOW`] of its first, up to [`MAX_BATCH`]. Most of a deletion's cost is per
//! request, not per link: the kernel's `rcu_barrier` after every unregistration spins on a
//! cross-CPU call, and waits for grace periods. Deleting veth pairs on a 2-CPU VM cost 4 ms of
//! CPU per pair one at a time, 0.9 in fours, 0.3 in sixteens. Each link of a batch holds the
//! RTNL lock about 0.15 ms, which is what bounds the batch: 32 links keep other netlink
//! requests waiting at most ~5 ms (links retired meanwhile go with it, beyond the bound).
//!
//! Errors are logged and the links retried later, one by one; on start the reaper sweeps the
//! group once (links retired by a previous run that crashed before deleting them).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};

use super::error::DataplaneError;
use super::link;
use super::naming::GRAVEYARD_GROUP;
use super::netlink::Conn;
use super::netns::NetnsFile;

/// Pause before retrying links whose deletion failed.
const RETRY_AFTER: Duration = Duration::from_millis(500);

/// How long a batch waits, from its first link, for more links to delete with it, when the
/// previous batch ended less than this long ago.
const GATHER_WINDOW: Duration = Duration::from_millis(50);

/// Most links deleted by one request (see the module doc for the RTNL time per link).
const MAX_BATCH: usize = 32;

/// A retired host link waiting for deletion.
#[derive(Debug, Clone)]
pub(crate) struct Doomed {
    /// Its index, which names it for the per-link fallback: the kernel does not hand an index
    /// out again while the netns lives (a new link of the same name has another).
    pub index: u32,
    /// Its name, for the logs.
    pub name: String,
}

#[derive(Debug, Default)]
struct Shared {
    /// Links queued and not yet confirmed gone (+1 for the start-up sweep while it runs).
    pending: AtomicUsize,
    /// Batches that left links behind (each one wakes `flush` waiters).
    failed_rounds: AtomicU64,
    changed: Notify,
}

impl Shared {
    fn done(&self, n: usize) {
        if n > 0 {
            self.pending.fetch_sub(n, Ordering::AcqRel);
            self.changed.notify_waiters();
        }
    }
}

/// Handle on the reaper thread; dropping it lets the thread finish its queue and exit.
#[derive(Debug)]
pub(crate) struct Reaper {
    tx: mpsc::UnboundedSender<Doomed>,
    shared: Arc<Shared>,
}

impl Reaper {
    /// Starts the reaper thread; it enters `host_ns` and opens its own socket there.
    pub(crate) fn start(host_ns: &NetnsFile) -> Result<Self, DataplaneError> {
        let label = host_ns.label().to_owned();
        let ns = host_ns.try_clone()?;
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared::default());
        // The start-up sweep counts as pending work until it ran.
        shared.pending.store(1, Ordering::Release);
        let thread_shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("netlink-reaper".to_owned())
            .spawn(move || run_thread(&ns, rx, &thread_shared))
            .map_err(|source| DataplaneError::Socket {
                netns: label,
                source: std::io::Error::other(format!("spawn the link reaper thread: {source}")),
            })?;
        Ok(Self { tx, shared })
    }

    /// Queues a retired link for deletion.
    pub(crate) fn queue(&self, doomed: Doomed) {
        self.shared.pending.fetch_add(1, Ordering::AcqRel);
        if self.tx.send(doomed).is_err() {
            // The thread is gone (it could not start): nothing will delete the link now; the
            // start-up sweep of the next run, or reconciliation, will.
            tracing::error!("link reaper not running: retired link left for the next sweep");
            self.shared.done(1);
        }
    }

    /// Waits until every queued link is deleted; returns early (with the number left) when a
    /// deletion round fails meanwhile, so that a shutdown never hangs on a kernel refusal.
    pub(crate) async fn flush(&self) -> usize {
        let failed_at_start = self.shared.failed_rounds.load(Ordering::Acquire);
        loop {
            let changed = self.shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let pending = self.shared.pending.load(Ordering::Acquire);
            if pending == 0 {
                return 0;
            }
            if self.shared.failed_rounds.load(Ordering::Acquire) != failed_at_start {
                return pending;
            }
            changed.await;
        }
    }
}

fn run_thread(ns: &NetnsFile, rx: mpsc::UnboundedReceiver<Doomed>, shared: &Arc<Shared>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "link reaper: no runtime; retired links stay until the next sweep");
            fail_all(rx, shared);
            return;
        }
    };
    let conn = ns
        .enter_current_thread()
        .and_then(|()| {
            netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_ROUTE).map_err(|source| {
                DataplaneError::Socket {
                    netns: ns.label().to_owned(),
                    source,
                }
            })
        })
        .and_then(|socket| runtime.block_on(async { Conn::from_socket(socket, ns.label()) }));
    match conn {
        Ok(conn) => runtime.block_on(reap(&conn, rx, shared)),
        Err(e) => {
            tracing::error!(error = %e, "link reaper: no socket in the host netns; retired links stay until the next sweep");
            fail_all(rx, shared);
        }
    }
}

/// Without a socket: account every queued link as handled (so `flush` never hangs) and log.
fn fail_all(mut rx: mpsc::UnboundedReceiver<Doomed>, shared: &Shared) {
    shared.failed_rounds.fetch_add(1, Ordering::AcqRel);
    shared.done(1);
    while let Some(d) = rx.blocking_recv() {
        tracing::error!(link = %d.name, "link reaper not running: link left for the next sweep");
        shared.failed_rounds.fetch_add(1, Ordering::AcqRel);
        shared.done(1);
    }
}

async fn reap(conn: &Conn, mut rx: mpsc::UnboundedReceiver<Doomed>, shared: &Shared) {
    // Start-up sweep: links retired by an earlier run that did not live to delete them.
    match link::delete_group(conn, GRAVEYARD_GROUP).await {
        Ok(true) => {
            tracing::info!(netns = %conn.netns(), "link reaper: deleted retired links left by an earlier run")
        }
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "link reaper: start-up sweep failed"),
    }
    shared.done(1);

    let mut retry: Vec<Doomed> = Vec::new();
    let mut last_batch_end: Option<tokio::time::Instant> = None;
    loop {
        let mut batch = std::mem::take(&mut retry);
        if batch.is_empty() {
            match rx.recv().await {
                Some(d) => batch.push(d),
                None => return,
            }
        } else {
            // Failed links wait a little; new arrivals join them.
            match tokio::time::timeout(RETRY_AFTER, rx.recv()).await {
                Ok(Some(d)) => batch.push(d),
                Ok(None) if batch.is_empty() => return,
                Ok(None) | Err(_) => {}
            }
        }
        let streaming = last_batch_end.is_some_and(|end| end.elapsed() < GATHER_WINDOW);
        if streaming {
            gather(&mut rx, &mut batch, GATHER_WINDOW, MAX_BATCH).await;
        } else {
            take_queued(&mut rx, &mut batch, MAX_BATCH);
        }
        let n = batch.len();
        retry = delete_batch(conn, batch).await;
        last_batch_end = Some(tokio::time::Instant::now());
        if !retry.is_empty() {
            shared.failed_rounds.fetch_add(1, Ordering::AcqRel);
        }
        shared.done(n - retry.len());
        if retry.is_empty() && rx.is_closed() && rx.is_empty() {
            return;
        }
    }
}

/// Adds to `batch` the links queued within `window` from now, until it holds `max`; returns
/// early when the queue closes (the daemon is shutting down).
async fn gather(
    rx: &mut mpsc::UnboundedReceiver<Doomed>,
    batch: &mut Vec<Doomed>,
    window: Duration,
    max: usize,
) {
    let until = tokio::time::Instant::now() + window;
    while batch.len() < max {
        match tokio::time::timeout_at(until, rx.recv()).await {
            Ok(Some(d)) => batch.push(d),
            Ok(None) | Err(_) => return,
        }
    }
}

/// Adds to `batch` the links already queued, until it holds `max`.
fn take_queued(rx: &mut mpsc::UnboundedReceiver<Doomed>, batch: &mut Vec<Doomed>, max: usize) {
    while batch.len() < max {
        match rx.try_recv() {
            Ok(d) => batch.push(d),
            Err(_) => return,
        }
    }
}

/// Deletes a batch (its links are in the graveyard group); returns the links still there.
async fn delete_batch(conn: &Conn, batch: Vec<Doomed>) -> Vec<Doomed> {
    // One request for the whole group (every link retired so far, these included).
    let one_by_one = match link::delete_group(conn, GRAVEYARD_GROUP).await {
        Ok(_) => return Vec::new(),
        Err(e) => {
            tracing::warn!(error = %e, links = batch.len(), "link reaper: group delete failed; deleting one by one");
            batch
        }
    };
    let mut left = Vec::new();
    for d in one_by_one {
        if let Err(e) = link::delete(conn, d.index, &d.name).await {
            tracing::warn!(error = %e, link = %d.name, "link reaper: delete failed; will retry");
            left.push(d);
        }
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Longer than any test may take: a gather that waited it out fails the test's bound.
    const LONG: Duration = Duration::from_secs(30);
    const BOUND: Duration = Duration::from_secs(10);

    fn doomed(index: u32) -> Doomed {
        Doomed {
            index,
            name: format!("pvn{index}"),
        }
    }

    fn names(batch: &[Doomed]) -> Vec<String> {
        batch.iter().map(|d| d.name.clone()).collect()
    }

    #[tokio::test]
    async fn a_batch_takes_links_retired_after_its_first_until_the_queue_closes() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut batch = vec![doomed(0)];
        let late = tokio::spawn(async move {
            tokio::task::yield_now().await;
            tx.send(doomed(1)).ok();
            tx.send(doomed(2)).ok();
        });
        tokio::time::timeout(BOUND, gather(&mut rx, &mut batch, LONG, 8))
            .await
            .expect("gather returns once the queue closed");
        late.await.expect("sender task");
        assert_eq!(names(&batch), names(&[doomed(0), doomed(1), doomed(2)]));
    }

    #[tokio::test]
    async fn a_batch_stops_at_its_limit_and_leaves_the_rest_queued() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        for n in 1..=5 {
            tx.send(doomed(n)).ok();
        }
        let mut batch = vec![doomed(0)];
        tokio::time::timeout(BOUND, gather(&mut rx, &mut batch, LONG, 4))
            .await
            .expect("a full batch does not wait for its window");
        assert_eq!(batch.len(), 4);
        assert_eq!(rx.try_recv().map(|d| d.index).ok(), Some(4));
        drop(tx);
    }

    #[test]
    fn an_idle_reaper_takes_what_is_queued_without_waiting() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        for n in 1..=3 {
            tx.send(doomed(n)).ok();
        }
        let mut batch = vec![doomed(0)];
        take_queued(&mut rx, &mut batch, 3);
        assert_eq!(names(&batch), names(&[doomed(0), doomed(1), doomed(2)]));
        take_queued(&mut rx, &mut batch, 8);
        assert_eq!(batch.len(), 4);
        take_queued(&mut rx, &mut batch, 8);
        assert_eq!(batch.len(), 4, "nothing more was queued");
    }

    #[tokio::test]
    async fn a_batch_ends_with_its_window() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut batch = vec![doomed(0)];
        tokio::time::timeout(
            BOUND,
            gather(&mut rx, &mut batch, Duration::from_millis(1), 8),
        )
        .await
        .expect("gather returns when its window ends, the queue still open");
        assert_eq!(names(&batch), names(&[doomed(0)]));
        drop(tx);
    }
}
