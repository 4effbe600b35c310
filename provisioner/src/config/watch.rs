//! Watching the network config with last-good semantics.
//!
//! [`ConfigWatcher`] follows a conf dir (or one config file) with inotify and publishes a
//! [`ConfigState`] on a `tokio::sync::watch` channel: the config in force, the outcome of the
//! last load attempt, and a generation that changes whenever the config in force does.
//!
//! # When a change is loaded
//! Any inotify event about a candidate file (`.conf`, `.conflist`, `.json`; in file mode, that
//! file) or about the watched dir itself (`IN_CREATE`, `IN_CLOSE_WRITE`, `IN_MOVED_TO`,
//! `IN_MOVED_FROM`, `IN_DELETE`, `IN_MODIFY`, `IN_ATTRIB`, `IN_DELETE_SELF`, `IN_MOVE_SELF`,
//! queue overflow) schedules a reload 50 ms after the last event (at most 500 ms after the
//! first of a burst). A reload also runs every 5 s as a safety net (symlink targets outside the
//! dir, missed events), and while the dir is missing its watch is retried every 250 ms. So a
//! file `mv`'d into the dir, `cp`'d, written in place, replaced by rename or removed is seen
//! within the debounce; unlike containerd, `IN_CREATE`/`IN_MOVED_TO`/`IN_ATTRIB` count.
//!
//! A reload chooses our network as [`load_conf_dir`] does (the runtime's choice) and then:
//! - **loaded**: our network parses and validates, and no file before it is *unsettled*: the
//!   config in force becomes it (the generation changes if its file or content differ);
//! - **kept**: our network fails validation, a file before ours (or, with no network of ours,
//!   any file) is *unsettled*, or the dir cannot be read for another reason than not existing:
//!   the config in force stays as it was (the last good one, or none) and the attempt reports
//!   the error naming the file;
//! - **not ready**: every file parses and none is our network (it was removed, or replaced by
//!   something else), or the dir (file) does not exist: no config is in force.
//!
//! *Unsettled* means unreadable or not JSON. This is what "half-written" means here: a strict
//! prefix of a JSON object never parses (its closing `}` comes last) and an empty file does
//! not either, so a file caught between truncate and the last write is unsettled, never
//! mistaken for a smaller config; it keeps the previous good config in force, and is loaded
//! once it parses. Broken JSON written over a good file is the same case, and stays reported
//! until it is fixed: the good config is not thrown away. With nothing in force, files before
//! ours that are unsettled do not block loading ours (being ready beats waiting); with a config
//! in force they do, so a config being written to a file before ours is not missed by
//! switching early. A permanently broken file before ours therefore blocks changes to ours,
//! loudly, until it is fixed or removed (containerd fails its whole load on it).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::ConfigError;
use super::conf_dir::{LoadedNetwork, load_conf_dir, load_conf_file};
use super::network::FileKind;

/// Timings of a watcher; [`Default`] gives the documented ones.
#[derive(Debug, Clone, Copy)]
pub struct WatchOptions {
    /// Quiet time after the last event before a reload.
    pub debounce: Duration,
    /// Longest wait after the first event of a burst before a reload.
    pub max_delay: Duration,
    /// Periodic reload, the safety net.
    pub recheck: Duration,
    /// How often to retry watching a dir that is missing.
    pub retry_missing: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            debounce: Duration::from_millis(50),
            max_delay: Duration::from_millis(500),
            recheck: Duration::from_secs(5),
            retry_missing: Duration::from_millis(250),
        }
    }
}

/// What is in force and what the last load attempt found.
#[derive(Debug, Clone)]
pub struct ConfigState {
    /// The config in force: `None` means not ready (never loaded, or our network is gone).
    pub current: Option<Arc<LoadedNetwork>>,
    /// The last load attempt.
    pub last_attempt: LoadAttempt,
    /// Changes (by one) whenever the config in force changes file or content, or goes away;
    /// 0 until a config was first loaded.
    pub generation: u64,
}

impl ConfigState {
    /// Whether a config is in force.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.current.is_some()
    }
}

/// The outcome of one load attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadAttempt {
    /// When it ran (also updated by periodic rechecks that change nothing, without notifying).
    pub at: SystemTime,
    /// The file loaded, or the file at fault; `None` if no file is (e.g. no network at all).
    pub file: Option<PathBuf>,
    /// `Ok` if our network was loaded (or was still the same), else the error.
    pub result: Result<(), String>,
}

/// What is watched.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Dir(PathBuf),
    File(PathBuf),
}

impl Source {
    fn of(path: PathBuf) -> Self {
        if !path.is_dir() && FileKind::of(&path).is_some() {
            Self::File(path)
        } else {
            Self::Dir(path)
        }
    }

    /// The directory the inotify watch is on.
    fn watched_dir(&self) -> &Path {
        match self {
            Self::Dir(d) => d,
            Self::File(f) => f.parent().unwrap_or_else(|| Path::new("/")),
        }
    }

    fn load(&self) -> Result<LoadedNetwork, ConfigError> {
        match self {
            Self::Dir(d) => load_conf_dir(d),
            Self::File(f) => load_conf_file(f),
        }
    }

    /// Whether an event about `name` (an entry of the watched dir) can change the outcome.
    fn concerns(&self, name: &Path) -> bool {
        match self {
            Self::Dir(_) => FileKind::of(name).is_some(),
            Self::File(f) => f.file_name() == Some(name.as_os_str()),
        }
    }
}

/// The outcome of a reload, before it is applied to the state.
#[derive(Debug)]
enum Decision {
    Load(LoadedNetwork),
    Keep {
        file: Option<PathBuf>,
        error: String,
    },
    NotReady {
        file: Option<PathBuf>,
        error: String,
    },
}

/// Applies the rules of the module doc to one load result.
fn decide(result: Result<LoadedNetwork, ConfigError>, has_current: bool) -> Decision {
    match result {
        Ok(loaded) => match loaded.first_unsettled() {
            Some(s) if has_current => Decision::Keep {
                file: Some(s.file.clone()),
                error: format!(
                    "{}: {}; it precedes {}, so the config in force is kept until it parses",
                    s.file.display(),
                    s.reason,
                    loaded.file.display()
                ),
            },
            _ => Decision::Load(loaded),
        },
        Err(e) => {
            let error = e.to_string();
            match e {
                ConfigError::NoNetwork { found, .. } => {
                    match found.into_iter().find(|s| s.reason.is_unsettled()) {
                        Some(s) => Decision::Keep {
                            file: Some(s.file),
                            error,
                        },
                        None => Decision::NotReady { file: None, error },
                    }
                }
                ConfigError::ReadDir { source, .. }
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    Decision::NotReady { file: None, error }
                }
                ConfigError::Read { path, source }
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    Decision::NotReady {
                        file: Some(path),
                        error,
                    }
                }
                ConfigError::NotANetwork { path, .. } => Decision::NotReady {
                    file: Some(path),
                    error,
                },
                other => Decision::Keep {
                    file: other.file().map(Path::to_owned),
                    error,
                },
            }
        }
    }
}

/// Applies a decision; returns whether anything a receiver cares about changed.
fn apply(state: &mut ConfigState, decision: Decision, now: SystemTime) -> bool {
    let before = (
        state.last_attempt.file.clone(),
        state.last_attempt.result.clone(),
    );
    let mut changed = false;
    let (file, result) = match decision {
        Decision::Load(loaded) => {
            let file = Some(loaded.file.clone());
            let same_in_force = state
                .current
                .as_deref()
                .is_some_and(|c| c.file == loaded.file && c.config == loaded.config);
            if !same_in_force {
                state.generation += 1;
                state.current = Some(Arc::new(loaded));
                changed = true;
            } else if state.current.as_deref() != Some(&loaded) {
                // Same config, new diagnostics (skipped files): no new generation.
                state.current = Some(Arc::new(loaded));
                changed = true;
            }
            (file, Ok(()))
        }
        Decision::Keep { file, error } => (file, Err(error)),
        Decision::NotReady { file, error } => {
            if state.current.take().is_some() {
                state.generation += 1;
                changed = true;
            }
            (file, Err(error))
        }
    };
    changed |= before != (file.clone(), result.clone());
    state.last_attempt = LoadAttempt {
        at: now,
        file,
        result,
    };
    changed
}

/// Follows a conf dir or file; see the module doc. Stops when dropped.
#[derive(Debug)]
pub struct ConfigWatcher {
    path: PathBuf,
    trigger: Arc<Notify>,
    task: JoinHandle<()>,
}

impl ConfigWatcher {
    /// Starts watching `path`: a conf dir, or a single `.conf`/`.conflist`/`.json` file. The
    /// first load runs before this returns, so the receiver's first state is meaningful; a
    /// missing dir is not an error (not ready until it appears). Must run inside a tokio
    /// runtime.
    ///
    /// # Errors
    /// [`ConfigError::Watch`] if inotify cannot be set up.
    pub fn start(
        path: impl Into<PathBuf>,
    ) -> Result<(Self, watch::Receiver<ConfigState>), ConfigError> {
        Self::start_with(path, WatchOptions::default())
    }

    /// [`ConfigWatcher::start`] with other timings (tests, tuning).
    ///
    /// # Errors
    /// [`ConfigError::Watch`] if inotify cannot be set up.
    pub fn start_with(
        path: impl Into<PathBuf>,
        options: WatchOptions,
    ) -> Result<(Self, watch::Receiver<ConfigState>), ConfigError> {
        let path = path.into();
        let source = Source::of(path.clone());
        let watch_err = |source| ConfigError::Watch {
            path: source_dir(&path),
            source,
        };
        let inotify = Inotify::init().map_err(watch_err)?;
        // The watch comes before the first load, so no change between them is missed.
        let wd = add_watch(&inotify.watches(), source.watched_dir());
        let stream = inotify
            .into_event_stream(vec![0u8; 4096])
            .map_err(watch_err)?;

        let mut state = ConfigState {
            current: None,
            last_attempt: LoadAttempt {
                at: SystemTime::now(),
                file: None,
                result: Err("not loaded yet".to_owned()),
            },
            generation: 0,
        };
        let decision = decide(source.load(), false);
        log_decision(&decision);
        apply(&mut state, decision, SystemTime::now());
        let (tx, rx) = watch::channel(state);

        let trigger = Arc::new(Notify::new());
        let task = tokio::spawn(run(source, stream, wd, tx, Arc::clone(&trigger), options));
        Ok((
            Self {
                path,
                trigger,
                task,
            },
            rx,
        ))
    }

    /// The path given to `start`.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Asks for a reload now (e.g. on SIGHUP).
    pub fn reload(&self) {
        self.trigger.notify_one();
    }
}

impl Drop for ConfigWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn source_dir(path: &Path) -> PathBuf {
    Source::of(path.to_owned()).watched_dir().to_owned()
}

fn watch_mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::CLOSE_WRITE
        | WatchMask::MOVED_TO
        | WatchMask::MOVED_FROM
        | WatchMask::DELETE
        | WatchMask::MODIFY
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
}

fn add_watch(watches: &inotify::Watches, dir: &Path) -> Option<WatchDescriptor> {
    let mut watches = watches.clone();
    match watches.add(dir, watch_mask()) {
        Ok(wd) => Some(wd),
        Err(e) => {
            tracing::debug!(dir = %dir.display(), error = %e, "cannot watch CNI config dir yet");
            None
        }
    }
}

fn log_decision(decision: &Decision) {
    match decision {
        Decision::Load(l) => {
            tracing::debug!(file = %l.file.display(), "CNI config load attempt succeeded")
        }
        Decision::Keep { error, .. } => {
            tracing::warn!(%error, "CNI config not loaded; keeping the config in force");
        }
        Decision::NotReady { error, .. } => tracing::warn!(%error, "no CNI config of ours"),
    }
}

async fn run(
    source: Source,
    mut stream: inotify::EventStream<Vec<u8>>,
    mut wd: Option<WatchDescriptor>,
    tx: watch::Sender<ConfigState>,
    trigger: Arc<Notify>,
    options: WatchOptions,
) {
    let mut pending: Option<(Instant, Instant)> = None;
    let mut stream_alive = true;
    let mut recheck = tokio::time::interval_at(Instant::now() + options.recheck, options.recheck);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut retry = tokio::time::interval(options.retry_missing);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    loop {
        let deadline =
            pending.map(|(first, last)| (last + options.debounce).min(first + options.max_delay));
        let mut reload_now = false;
        tokio::select! {
            event = stream.next(), if stream_alive => match event {
                Some(Ok(event)) => {
                    let mut relevant = event.mask.contains(EventMask::Q_OVERFLOW);
                    if Some(&event.wd) == wd.as_ref()
                        && event.mask.intersects(
                            EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED,
                        )
                    {
                        if event.mask.contains(EventMask::MOVE_SELF)
                            && let Some(old) = wd.take()
                        {
                            // The watch would follow the dir to its new name: drop it.
                            let _ = stream.watches().remove(old);
                        }
                        wd = None;
                        relevant = true;
                    }
                    match &event.name {
                        Some(name) => relevant |= source.concerns(Path::new(name)),
                        None => relevant |= event.mask.contains(EventMask::ATTRIB),
                    }
                    if relevant {
                        let now = Instant::now();
                        pending = Some((pending.map_or(now, |(first, _)| first), now));
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "reading inotify events failed; reloading");
                    tokio::time::sleep(options.debounce).await;
                    reload_now = true;
                }
                None => {
                    tracing::error!("inotify stream ended; only periodic rechecks remain");
                    stream_alive = false;
                }
            },
            () = sleep_until_opt(deadline) => reload_now = true,
            _ = recheck.tick() => reload_now = true,
            _ = retry.tick(), if wd.is_none() => {
                wd = add_watch(&stream.watches(), source.watched_dir());
                reload_now = wd.is_some();
            }
            () = trigger.notified() => reload_now = true,
        }
        if reload_now {
            pending = None;
            reload(&source, &tx).await;
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn reload(source: &Source, tx: &watch::Sender<ConfigState>) {
    let src = source.clone();
    let Ok(result) = tokio::task::spawn_blocking(move || src.load()).await else {
        return;
    };
    let has_current = tx.borrow().current.is_some();
    let decision = decide(result, has_current);
    let now = SystemTime::now();
    tx.send_if_modified(|state| {
        let generation = state.generation;
        let changed = apply(state, decision, now);
        if changed {
            match (&state.current, &state.last_attempt.result) {
                (Some(c), Ok(())) if state.generation != generation => tracing::info!(
                    file = %c.file.display(),
                    generation = state.generation,
                    "CNI config loaded"
                ),
                (_, Err(error)) => tracing::warn!(
                    %error,
                    ready = state.current.is_some(),
                    generation = state.generation,
                    "CNI config not loaded"
                ),
                _ => {}
            }
        }
        changed
    });
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests fail loudly on unexpected input")]
mod tests {
    use super::*;
    use crate::config::conf_dir::{SkipReason, SkippedFile};
    use crate::config::network::NetworkConfig;

    fn loaded(file: &str, mtu: u32, skipped: Vec<SkippedFile>) -> LoadedNetwork {
        LoadedNetwork {
            config: NetworkConfig {
                name: "pod".into(),
                cni_version: "1.0.0".into(),
                mtu: Some(mtu),
                ipam: serde_json::json!({"subnet": "10.0.0.0/24"}),
                socket: None,
                raw_plugin: serde_json::json!({}),
            },
            file: file.into(),
            plugin_index: Some(0),
            plugin_types: vec!["provisioner".into()],
            skipped,
        }
    }

    fn broken(file: &str) -> SkippedFile {
        SkippedFile {
            file: file.into(),
            reason: SkipReason::InvalidJson("EOF".into()),
        }
    }

    fn empty_state() -> ConfigState {
        ConfigState {
            current: None,
            last_attempt: LoadAttempt {
                at: SystemTime::now(),
                file: None,
                result: Err("not loaded yet".into()),
            },
            generation: 0,
        }
    }

    #[test]
    fn generation_moves_only_with_the_config_in_force() {
        let mut s = empty_state();
        let now = SystemTime::now();
        assert!(apply(
            &mut s,
            decide(Ok(loaded("/d/10.conflist", 1460, vec![])), false),
            now
        ));
        assert_eq!(s.generation, 1);
        // Same again: nothing to notify.
        assert!(!apply(
            &mut s,
            decide(Ok(loaded("/d/10.conflist", 1460, vec![])), true),
            now
        ));
        assert_eq!(s.generation, 1);
        // New content: new generation.
        assert!(apply(
            &mut s,
            decide(Ok(loaded("/d/10.conflist", 1400, vec![])), true),
            now
        ));
        assert_eq!(s.generation, 2);
        // Invalid: kept, error reported, same generation.
        let e = ConfigError::invalid("/d/10.conflist", "plugins[0].mtu", "bad");
        assert!(apply(&mut s, decide(Err(e), true), now));
        assert_eq!(s.generation, 2);
        assert_eq!(s.current.as_ref().unwrap().config.mtu, Some(1400));
        assert_eq!(
            s.last_attempt.file.as_deref(),
            Some(Path::new("/d/10.conflist"))
        );
        assert!(
            s.last_attempt
                .result
                .as_ref()
                .unwrap_err()
                .contains("plugins[0].mtu")
        );
        // No network at all, every file settled: not ready.
        let e = ConfigError::NoNetwork {
            dir: "/d".into(),
            found: vec![],
        };
        assert!(apply(&mut s, decide(Err(e), true), now));
        assert!(s.current.is_none());
        assert_eq!(s.generation, 3);
    }

    #[test]
    fn unsettled_files_keep_the_last_good_config() {
        let mut s = empty_state();
        let now = SystemTime::now();
        apply(
            &mut s,
            decide(Ok(loaded("/d/10.conflist", 1460, vec![])), false),
            now,
        );
        // Our file half-written: no network found, but a file is unsettled.
        let e = ConfigError::NoNetwork {
            dir: "/d".into(),
            found: vec![broken("/d/10.conflist")],
        };
        apply(&mut s, decide(Err(e), true), now);
        assert!(s.current.is_some());
        assert_eq!(s.generation, 1);
        assert_eq!(
            s.last_attempt.file.as_deref(),
            Some(Path::new("/d/10.conflist"))
        );
        // A broken file before a changed network of ours: not switching while in force...
        let d = decide(
            Ok(loaded(
                "/d/20.conflist",
                1400,
                vec![broken("/d/05.conflist")],
            )),
            true,
        );
        apply(&mut s, d, now);
        assert_eq!(
            s.current.as_ref().unwrap().file,
            Path::new("/d/10.conflist")
        );
        assert!(
            s.last_attempt
                .result
                .as_ref()
                .unwrap_err()
                .contains("/d/05.conflist")
        );
        // ...but with nothing in force, being ready wins.
        let d = decide(
            Ok(loaded(
                "/d/20.conflist",
                1400,
                vec![broken("/d/05.conflist")],
            )),
            false,
        );
        assert!(matches!(d, Decision::Load(_)));
    }

    #[test]
    fn a_missing_dir_or_file_is_not_ready_another_read_error_keeps_the_config() {
        let gone = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let denied = || std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let read_dir = |source| ConfigError::ReadDir {
            dir: "/d".into(),
            source,
        };
        let read = |source| ConfigError::Read {
            path: "/d/10.conflist".into(),
            source,
        };
        for (error, ready_after) in [
            (read_dir(gone()), false),
            (read(gone()), false),
            (read_dir(denied()), true),
            (read(denied()), true),
        ] {
            let shown = error.to_string();
            let mut s = empty_state();
            let now = SystemTime::now();
            apply(
                &mut s,
                decide(Ok(loaded("/d/10.conflist", 1460, vec![])), false),
                now,
            );
            assert!(apply(&mut s, decide(Err(error), true), now), "{shown}");
            assert_eq!(s.is_ready(), ready_after, "{shown}");
            assert_eq!(s.current.is_some(), ready_after, "{shown}");
            assert_eq!(s.last_attempt.result, Err(shown.clone()));
        }
    }

    #[test]
    fn a_path_is_a_file_to_follow_only_if_it_is_a_config_file_name() {
        let d = tempfile::tempdir().unwrap();
        let dir_named_like_a_file = d.path().join("net.conf");
        std::fs::create_dir(&dir_named_like_a_file).unwrap();
        let missing_dir = d.path().join("net.d");
        let file = d.path().join("10.conflist");
        assert_eq!(
            Source::of(dir_named_like_a_file.clone()),
            Source::Dir(dir_named_like_a_file)
        );
        assert_eq!(Source::of(missing_dir.clone()), Source::Dir(missing_dir));
        assert_eq!(Source::of(file.clone()), Source::File(file.clone()));
        assert_eq!(Source::File(file).watched_dir(), d.path());
    }

    #[test]
    fn only_events_about_candidate_files_trigger_a_reload() {
        let dir = Source::Dir("/d".into());
        assert!(dir.concerns(Path::new("10.conflist")));
        assert!(dir.concerns(Path::new("99-lo.conf")));
        assert!(!dir.concerns(Path::new(".10.conflist.swp")));
        let file = Source::File("/d/10.conflist".into());
        assert!(file.concerns(Path::new("10.conflist")));
        assert!(!file.concerns(Path::new("20.conflist")));
    }

    const OURS: &str = r#"{"cniVersion":"1.0.0","name":"pod","plugins":[
        {"type":"provisioner","mtu":1460,"ipam":{"subnet":"10.244.1.0/24"}}]}"#;

    /// Only inotify events (or `reload`) can trigger a reload within a test's bounds.
    fn events_only() -> WatchOptions {
        WatchOptions {
            debounce: Duration::from_millis(10),
            max_delay: Duration::from_millis(100),
            recheck: Duration::from_secs(3600),
            retry_missing: Duration::from_millis(20),
        }
    }

    /// Waits at most 10 s (a loaded CI machine) for a published state that satisfies `pred`.
    async fn wait_for(
        rx: &mut watch::Receiver<ConfigState>,
        what: &str,
        pred: impl Fn(&ConfigState) -> bool,
    ) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if pred(&rx.borrow_and_update()) {
                return;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => panic!("the watcher stopped before {what}"),
                Err(_) => panic!("timed out waiting for {what}; state: {:#?}", *rx.borrow()),
            }
        }
    }

    fn mtu(s: &ConfigState) -> Option<u32> {
        s.current.as_ref().and_then(|c| c.config.mtu)
    }

    fn in_force(s: &ConfigState) -> Option<&Path> {
        s.current.as_deref().map(|c| c.file.as_path())
    }

    /// The log lines written while the guard lives (on this thread, so with a current-thread
    /// runtime also those of the watcher's task).
    #[derive(Clone, Default)]
    struct Log(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Log {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Log {
        fn capture(&self) -> tracing::subscriber::DefaultGuard {
            let log = self.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_writer(move || log.clone())
                .with_ansi(false)
                .with_max_level(tracing::Level::INFO)
                .finish();
            tracing::subscriber::set_default(subscriber)
        }

        fn lines(&self) -> Vec<String> {
            String::from_utf8_lossy(&self.0.lock().unwrap())
                .lines()
                .map(str::to_owned)
                .collect()
        }
    }

    #[tokio::test]
    async fn inotify_events_and_reload_requests_reload_the_config() {
        let log = Log::default();
        let _guard = log.capture();
        let root = tempfile::tempdir().unwrap();
        let conf = root.path().join("net.d");
        let staging = root.path().join("staging");
        std::fs::create_dir(&conf).unwrap();
        std::fs::create_dir(&staging).unwrap();
        let (watcher, mut rx) = ConfigWatcher::start_with(&conf, events_only()).unwrap();
        assert_eq!(watcher.path(), conf);
        assert!(!rx.borrow().is_ready());

        // `mv` into the dir: only IN_MOVED_TO there.
        std::fs::write(staging.join("10.conflist"), OURS).unwrap();
        std::fs::rename(staging.join("10.conflist"), conf.join("10.conflist")).unwrap();
        let ours = conf.join("10.conflist");
        wait_for(&mut rx, "the moved-in config", |s| {
            in_force(s) == Some(ours.as_path())
        })
        .await;

        // An empty file created before ours (IN_CREATE, IN_CLOSE_WRITE, no IN_MODIFY) is
        // unsettled: the config in force is kept and the attempt names it.
        let empty = conf.join("05-new.conf");
        std::fs::File::create(&empty).unwrap();
        wait_for(&mut rx, "the empty file reported", |s| {
            s.last_attempt.file.as_deref() == Some(empty.as_path())
        })
        .await;
        assert_eq!(in_force(&rx.borrow()), Some(ours.as_path()));
        // `rm` (IN_DELETE only): loaded again.
        std::fs::remove_file(&empty).unwrap();
        wait_for(&mut rx, "the empty file gone", |s| {
            s.last_attempt.result.is_ok()
        })
        .await;

        // Written in place and still open (IN_MODIFY, no IN_CLOSE_WRITE yet).
        let at = OURS.find("1460").unwrap() as u64;
        let in_place = std::fs::OpenOptions::new().write(true).open(&ours).unwrap();
        std::os::unix::fs::FileExt::write_at(&in_place, b"1400", at).unwrap();
        wait_for(&mut rx, "mtu 1400 written in place", |s| {
            mtu(s) == Some(1400)
        })
        .await;

        // Changed through a hard link outside the dir (no event in the dir), then `chmod`ed
        // (IN_ATTRIB only; `in_place` stays open so that no IN_CLOSE_WRITE comes first).
        let hard = staging.join("hard.conflist");
        std::fs::hard_link(&ours, &hard).unwrap();
        let outside = std::fs::OpenOptions::new().write(true).open(&hard).unwrap();
        std::os::unix::fs::FileExt::write_at(&outside, b"1420", at).unwrap();
        drop(outside);
        std::fs::set_permissions(&ours, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        wait_for(&mut rx, "mtu 1420 after chmod", |s| mtu(s) == Some(1420)).await;
        drop(in_place);

        // A symlink's target outside the dir changes without an event in the dir: `reload`
        // (SIGHUP) picks it up.
        let target = staging.join("20-real.conflist");
        std::fs::write(&target, OURS).unwrap();
        std::os::unix::fs::symlink(&target, conf.join("02-link.conflist")).unwrap();
        let link = conf.join("02-link.conflist");
        wait_for(&mut rx, "the symlinked config", |s| {
            in_force(s) == Some(link.as_path()) && s.last_attempt.result.is_ok()
        })
        .await;
        std::fs::write(&target, OURS.replace("1460", "1400")).unwrap();
        watcher.reload();
        wait_for(&mut rx, "the changed symlink target", |s| {
            mtu(s) == Some(1400)
        })
        .await;

        // The dir moved away (IN_MOVE_SELF): not ready; back: watched and loaded again.
        let moved = root.path().join("net.d.old");
        std::fs::rename(&conf, &moved).unwrap();
        wait_for(&mut rx, "not ready with the dir gone", |s| !s.is_ready()).await;
        std::fs::rename(&moved, &conf).unwrap();
        wait_for(&mut rx, "ready with the dir back", ConfigState::is_ready).await;

        // Dropped: the watcher's task ends and the channel closes.
        drop(watcher);
        let closed = tokio::time::timeout(Duration::from_secs(10), async {
            while rx.changed().await.is_ok() {}
        })
        .await;
        assert!(
            closed.is_ok(),
            "the watcher kept running after being dropped"
        );

        // What an operator reads: not ready at first; each new config in force once, with its
        // generation; the empty file as the reason the config was not loaded.
        let lines = log.lines();
        assert!(
            lines[0].contains("WARN") && lines[0].contains("no CNI config of ours"),
            "{lines:#?}"
        );
        let loaded: Vec<&String> = lines
            .iter()
            .filter(|l| l.contains("CNI config loaded"))
            .collect();
        // 1 moved in, 2 written in place, 3 chmod, 4 symlink, 5 reload, (6 dir gone), 7 back.
        assert_eq!(loaded.len(), 6, "{lines:#?}");
        for (line, generation) in loaded.iter().zip([1, 2, 3, 4, 5, 7]) {
            assert!(
                line.contains("INFO") && line.contains(&format!("generation={generation}")),
                "{lines:#?}"
            );
        }
        assert!(
            lines.iter().any(|l| l.contains("WARN")
                && l.contains("CNI config not loaded")
                && l.contains("05-new.conf")),
            "{lines:#?}"
        );
    }

    #[tokio::test]
    async fn without_a_deadline_the_debounce_timer_never_fires() {
        // The event loop selects on it: firing at once would reload in a busy loop.
        let fired = tokio::time::timeout(Duration::from_millis(20), sleep_until_opt(None)).await;
        assert!(fired.is_err(), "fired without a deadline");
        let soon = Instant::now() + Duration::from_millis(1);
        let fired =
            tokio::time::timeout(Duration::from_secs(10), sleep_until_opt(Some(soon))).await;
        assert!(fired.is_ok(), "did not fire at its deadline");
    }
}
