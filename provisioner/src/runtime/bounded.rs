//! Reading files another process names (a runtime's config, the files of its CNI conf dir)
//! without letting that process decide how long or how much: a file is opened non-blocking
//! (a FIFO or a device cannot hang the open), must be a regular file, and is read up to a size
//! cap; the whole read runs on one worker thread of its own and the caller waits for it at most
//! a deadline (a file on a hung file system holds that worker, never the caller).

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// Largest file read: a runtime's config or a CNI network file is a few KiB.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot be opened: {0}")]
    Open(#[source] std::io::Error),
    #[error("is not a regular file")]
    NotRegular,
    #[error("is larger than {MAX_FILE_BYTES} bytes")]
    TooLarge,
    #[error("cannot be read: {0}")]
    Read(#[source] std::io::Error),
}

impl ReadError {
    /// The file does not exist (a runtime then uses its defaults).
    pub fn is_missing(&self) -> bool {
        matches!(self, Self::Open(e) if e.kind() == std::io::ErrorKind::NotFound)
    }
}

/// The bytes of the regular file at `path`, at most [`MAX_FILE_BYTES`]; opened with
/// `O_NONBLOCK` and checked before any read. Blocks only where the file system does: call it
/// through [`within_deadline`] where that matters.
pub fn read_file(path: &Path) -> Result<Vec<u8>, ReadError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(ReadError::Open)?;
    let meta = file.metadata().map_err(ReadError::Read)?;
    if !meta.file_type().is_file() {
        return Err(ReadError::NotRegular);
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(ReadError::TooLarge);
    }
    let mut bytes = Vec::new();
    // One byte past the cap tells a file that grew since the stat.
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(ReadError::Read)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(ReadError::TooLarge);
    }
    Ok(bytes)
}

/// [`read_file`] as UTF-8 text.
pub fn read_text(path: &Path) -> Result<String, ReadError> {
    let bytes = read_file(path)?;
    String::from_utf8(bytes)
        .map_err(|e| ReadError::Read(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

/// Why a job did not finish for its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unfinished {
    #[error("not done within {} ms", .0.as_millis())]
    TimedOut(Duration),
    #[error("an earlier read is still not done")]
    Busy,
}

type Job = Box<dyn FnOnce() + Send>;

/// A job and how long its caller waits for it.
struct Queued {
    job: Job,
    deadline: Duration,
}

/// The worker: a queue of one job, and since when it runs the job it runs now, with that job's
/// deadline.
struct Worker {
    jobs: SyncSender<Queued>,
    running: Arc<Mutex<Option<(Instant, Duration)>>>,
}

impl Worker {
    /// Whether the job it runs has run longer than its caller's deadline: stuck (its caller
    /// gave up).
    fn stuck(&self) -> bool {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|(since, deadline)| since.elapsed() > deadline)
    }
}

fn worker() -> Option<&'static Worker> {
    static WORKER: OnceLock<Option<Worker>> = OnceLock::new();
    WORKER
        .get_or_init(|| {
            let (jobs, queue) = std::sync::mpsc::sync_channel::<Queued>(1);
            let running = Arc::new(Mutex::new(None));
            let served = Arc::clone(&running);
            std::thread::Builder::new()
                .name("runtime-files".to_owned())
                .spawn(move || serve(&queue, &served))
                .map_err(|e| tracing::warn!(error = %e, "cannot start the runtime-files reader"))
                .ok()?;
            Some(Worker { jobs, running })
        })
        .as_ref()
}

fn serve(queue: &Receiver<Queued>, running: &Mutex<Option<(Instant, Duration)>>) {
    let set = |now: Option<(Instant, Duration)>| {
        *running.lock().unwrap_or_else(PoisonError::into_inner) = now;
    };
    while let Ok(Queued { job, deadline }) = queue.recv() {
        set(Some((Instant::now(), deadline)));
        job();
        set(None);
    }
}

/// Pause between two tries to queue a job behind a short one.
const QUEUE_RETRY: Duration = Duration::from_millis(2);

/// Runs `job` on the reader's worker thread and waits for it at most `deadline`, queueing
/// included. While the worker is stuck on an earlier job (running longer than that job's
/// deadline: a hung file system), `job` is refused at once: the callers never queue behind it.
pub fn within_deadline<T: Send + 'static>(
    deadline: Duration,
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Unfinished> {
    let started = Instant::now();
    let worker = worker().ok_or(Unfinished::Busy)?;
    let (done, result) = std::sync::mpsc::sync_channel(1);
    let mut job = Queued {
        job: Box::new(move || {
            let _ = done.send(job());
        }),
        deadline,
    };
    loop {
        if worker.stuck() {
            return Err(Unfinished::Busy);
        }
        match worker.jobs.try_send(job) {
            Ok(()) => break,
            Err(TrySendError::Full(again)) if started.elapsed() < deadline => {
                job = again;
                std::thread::sleep(QUEUE_RETRY);
            }
            Err(TrySendError::Full(_)) => return Err(Unfinished::TimedOut(deadline)),
            Err(TrySendError::Disconnected(_)) => return Err(Unfinished::Busy),
        }
    }
    result
        .recv_timeout(deadline.saturating_sub(started.elapsed()))
        .map_err(|_| Unfinished::TimedOut(deadline))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_regular_file_within_the_cap_is_read() {
        let dir = tempfile::tempdir().expect("dir");
        let small = dir.path().join("config.toml");
        std::fs::write(&small, "version = 2\n").expect("write");
        assert_eq!(read_text(&small).expect("read"), "version = 2\n");
        assert!(matches!(
            read_file(Path::new("/dev/zero")),
            Err(ReadError::NotRegular)
        ));
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        assert!(matches!(read_file(&fifo), Err(ReadError::NotRegular)));
        let big = dir.path().join("big");
        std::fs::write(
            &big,
            vec![b'#'; usize::try_from(MAX_FILE_BYTES).expect("cap") + 1],
        )
        .expect("write");
        assert!(matches!(read_file(&big), Err(ReadError::TooLarge)));
        let missing = read_file(&dir.path().join("none")).expect_err("missing");
        assert!(missing.is_missing(), "{missing}");
    }

    #[test]
    fn a_stuck_job_holds_only_the_worker() {
        // Short jobs queue behind one another.
        let many: Vec<_> = (0..4)
            .map(|i| std::thread::spawn(move || within_deadline(Duration::from_secs(5), move || i)))
            .collect();
        for (i, one) in many.into_iter().enumerate() {
            assert_eq!(one.join().expect("caller"), Ok(i));
        }
        let (release, stuck) = std::sync::mpsc::channel::<()>();
        let started = Instant::now();
        let first = within_deadline(Duration::from_millis(100), move || {
            let _ = stuck.recv();
        });
        assert_eq!(first, Err(Unfinished::TimedOut(Duration::from_millis(100))));
        assert!(started.elapsed() < Duration::from_secs(2));
        // Once it has run past its caller's deadline it is stuck: the next caller is refused
        // at once.
        std::thread::sleep(Duration::from_millis(150));
        let second = Instant::now();
        assert_eq!(
            within_deadline(Duration::from_secs(5), || 1),
            Err(Unfinished::Busy)
        );
        assert!(second.elapsed() < Duration::from_millis(100));
        release.send(()).expect("release");
        let mut answer = Err(Unfinished::Busy);
        for _ in 0..100 {
            answer = within_deadline(Duration::from_secs(1), || 2);
            if answer.is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(answer, Ok(2));
    }
}
