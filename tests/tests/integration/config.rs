//! The config watcher against every way of changing a conf dir: each step asserts the config in
//! force, the generation and the reported error. Waits are bounded (2 s) and end as soon as the
//! expected state is published; no root needed.

#![expect(
    clippy::unwrap_used,
    reason = "a test fails loudly on unexpected input"
)]

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use provisioner::config::{ConfigState, ConfigWatcher, write_atomically};
use tokio::sync::watch::Receiver;

const WAIT: Duration = Duration::from_secs(2);

fn ours(mtu: u32) -> String {
    format!(
        r#"{{
  "cniVersion": "1.0.0",
  "name": "pod-network",
  "plugins": [
    {{"type": "provisioner", "mtu": {mtu}, "socket": "/run/provisioner/provisioner.sock",
      "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "10.244.1.0/24"}}]],
               "routes": [{{"dst": "0.0.0.0/0"}}]}}}},
    {{"type": "portmap", "capabilities": {{"portMappings": true}}}}
  ]
}}
"#
    )
}

const LOOPBACK: &str = r#"{"cniVersion": "0.3.1", "name": "cni-loopback", "type": "loopback"}"#;

/// A conf dir and a staging dir on the same filesystem (for `mv`).
struct Dirs {
    _root: tempfile::TempDir,
    conf: PathBuf,
    staging: PathBuf,
}

fn dirs() -> Dirs {
    let root = tempfile::tempdir().unwrap();
    let conf = root.path().join("net.d");
    let staging = root.path().join("staging");
    fs::create_dir(&conf).unwrap();
    fs::create_dir(&staging).unwrap();
    Dirs {
        conf,
        staging,
        _root: root,
    }
}

/// Waits (at most [`WAIT`]) for a published state that satisfies `pred`.
async fn wait_for(
    rx: &mut Receiver<ConfigState>,
    what: &str,
    pred: impl Fn(&ConfigState) -> bool,
) -> ConfigState {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        {
            let state = rx.borrow_and_update();
            if pred(&state) {
                return state.clone();
            }
        }
        if tokio::time::timeout_at(deadline, rx.changed())
            .await
            .is_err()
        {
            panic!("timed out waiting for {what}; state: {:#?}", *rx.borrow());
        }
    }
}

fn mtu(s: &ConfigState) -> Option<u32> {
    s.current.as_ref().and_then(|c| c.config.mtu)
}

fn error(s: &ConfigState) -> &str {
    s.last_attempt
        .result
        .as_ref()
        .err()
        .map_or("", String::as_str)
}

/// Waits until `mtu` is in force from `file`, with a clean last attempt.
async fn wait_loaded(rx: &mut Receiver<ConfigState>, file: &Path, want: u32) -> ConfigState {
    let s = wait_for(rx, &format!("mtu {want} from {}", file.display()), |s| {
        mtu(s) == Some(want)
            && s.current.as_ref().is_some_and(|c| c.file == file)
            && s.last_attempt.result.is_ok()
    })
    .await;
    assert_eq!(s.last_attempt.file.as_deref(), Some(file));
    s
}

#[tokio::test]
async fn empty_then_loopback_only_then_mv_into_the_dir() {
    let d = dirs();
    let (_w, mut rx) = ConfigWatcher::start(&d.conf).unwrap();
    let s = rx.borrow().clone();
    assert!(s.current.is_none());
    assert_eq!(s.generation, 0);
    assert_eq!(
        error(&s),
        format!(
            "no network with type provisioner in {}: no .conf, .conflist or .json files",
            d.conf.display()
        )
    );

    // The motivating failure: only a loopback network. Not ready, and said why.
    fs::write(d.staging.join("99-loopback.conf"), LOOPBACK).unwrap();
    fs::rename(
        d.staging.join("99-loopback.conf"),
        d.conf.join("99-loopback.conf"),
    )
    .unwrap();
    let s = wait_for(&mut rx, "loopback-only error", |s| {
        error(s).ends_with("99-loopback.conf (loopback only)")
    })
    .await;
    assert!(s.current.is_none());

    // A complete file mv'd into the dir (IN_MOVED_TO only: containerd misses this one).
    let file = d.conf.join("10-pod.conflist");
    fs::write(d.staging.join("10-pod.conflist"), ours(1460)).unwrap();
    fs::rename(d.staging.join("10-pod.conflist"), &file).unwrap();
    let s = wait_loaded(&mut rx, &file, 1460).await;
    assert_eq!(s.generation, 1);
    let current = s.current.unwrap();
    assert_eq!(current.config.name, "pod-network");
    assert_eq!(current.plugin_types, ["provisioner", "portmap"]);
    assert!(current.runtime_default().is_none());

    // mv'd out again (IN_MOVED_FROM): not ready.
    fs::rename(&file, d.staging.join("10-pod.conflist")).unwrap();
    let s = wait_for(&mut rx, "not ready after mv out", |s| s.current.is_none()).await;
    assert_eq!(s.generation, 2);
    assert!(
        error(&s).ends_with("99-loopback.conf (loopback only)"),
        "{}",
        error(&s)
    );
}

#[tokio::test]
async fn cp_into_the_dir_and_over_the_file() {
    let d = dirs();
    let (_w, mut rx) = ConfigWatcher::start(&d.conf).unwrap();
    let file = d.conf.join("10-pod.conflist");
    fs::write(d.staging.join("a"), ours(1460)).unwrap();
    fs::write(d.staging.join("b"), ours(1400)).unwrap();

    fs::copy(d.staging.join("a"), &file).unwrap();
    assert_eq!(wait_loaded(&mut rx, &file, 1460).await.generation, 1);

    // cp over an existing file: open(O_TRUNC), write, close.
    fs::copy(d.staging.join("b"), &file).unwrap();
    assert_eq!(wait_loaded(&mut rx, &file, 1400).await.generation, 2);
}

#[tokio::test]
async fn replaced_by_rename() {
    let d = dirs();
    let file = d.conf.join("10-pod.conflist");
    fs::write(&file, ours(1460)).unwrap();
    let (_w, mut rx) = ConfigWatcher::start(&d.conf).unwrap();
    // The first load runs before start returns.
    let s = rx.borrow().clone();
    assert_eq!((mtu(&s), s.generation), (Some(1460), 1));

    // The project's atomic writer: temp file in the dir, rename over.
    write_atomically(&file, ours(1400).as_bytes(), 0o644).unwrap();
    assert_eq!(wait_loaded(&mut rx, &file, 1400).await.generation, 2);

    // A hand-made temp file with a loadable extension, then renamed over.
    let tmp = d.conf.join("10-pod.conflist.new.json");
    fs::write(&tmp, "{").unwrap(); // still being written, and lexically after ours
    fs::write(&tmp, ours(1300)).unwrap();
    fs::rename(&tmp, &file).unwrap();
    let s = wait_loaded(&mut rx, &file, 1300).await;
    assert_eq!(s.generation, 3);
}

#[tokio::test]
async fn in_place_truncate_then_write_in_two_steps() {
    let d = dirs();
    let file = d.conf.join("10-pod.conflist");
    fs::write(&file, ours(1460)).unwrap();
    let (_w, mut rx) = ConfigWatcher::start(&d.conf).unwrap();
    assert_eq!(mtu(&rx.borrow()), Some(1460));

    let new = ours(1400);
    let (first, second) = new.split_at(new.len() / 2);
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&file)
        .unwrap();
    f.write_all(first.as_bytes()).unwrap();
    f.flush().unwrap();

    // Half-written: the previous good config stays in force, the error is reported.
    let s = wait_for(&mut rx, "half-written error", |s| {
        s.last_attempt.result.is_err()
    })
    .await;
    assert_eq!(mtu(&s), Some(1460));
    assert_eq!(s.generation, 1);
    assert_eq!(s.last_attempt.file.as_deref(), Some(file.as_path()));
    assert!(
        error(&s).contains("10-pod.conflist (invalid JSON: "),
        "{}",
        error(&s)
    );

    // The pause is longer than the debounce: the half-written file was surely looked at.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let s = rx.borrow().clone();
    assert_eq!((mtu(&s), s.generation), (Some(1460), 1));

    f.write_all(second.as_bytes()).unwrap();
    drop(f);
    assert_eq!(wait_loaded(&mut rx, &file, 1400).await.generation, 2);
}

#[tokio::test]
async fn removed() {
    let d = dirs();
    let file = d.conf.join("10-pod.conflist");
    let other = d.conf.join("20-pod.conflist");
    fs::write(&file, ours(1460)).unwrap();
    fs::write(&other, ours(1400)).unwrap();
    fs::write(d.conf.join("99-loopback.conf"), LOOPBACK).unwrap();
    let (_w, mut rx) = ConfigWatcher::start(&d.conf).unwrap();
    assert_eq!(mtu(&rx.borrow()), Some(1460));

    // Another candidate remains: it takes over, as a runtime would choose it.
    fs::remove_file(&file).unwrap();
    assert_eq!(wait_loaded(&mut rx, &other, 1400).await.generation, 2);

    // No candidate left: not ready, and the error says what is there.
    fs::remove_file(&other).unwrap();
    let s = wait_for(&mut rx, "not ready", |s| s.current.is_none()).await;
    assert_eq!(s.generation, 3);
    assert_eq!(
        error(&s),
        format!(
            "no network with type provisioner in {}: 99-loopback.conf (loopback only)",
            d.conf.display()
        )
    );
    assert_eq!(s.last_attempt.file, None);
}

#[tokio::test]
async fn broken_json_over_a_good_file_keeps_the_good_one() {
    let d = dirs();
    let file = d.conf.join("10-pod.conflist");
    fs::write(&file, ours(1460)).unwrap();
    let (_w, mut rx) = ConfigWatcher::start(&d.conf).unwrap();

    fs::write(&file, "{\"cniVersion\": \"1.0.0\", \"name\": oops}").unwrap();
    let s = wait_for(&mut rx, "broken JSON error", |s| {
        s.last_attempt.result.is_err()
    })
    .await;
    assert_eq!((mtu(&s), s.generation), (Some(1460), 1));
    assert!(
        error(&s).contains("10-pod.conflist (invalid JSON: expected value"),
        "{}",
        error(&s)
    );
    assert_eq!(s.last_attempt.file.as_deref(), Some(file.as_path()));

    // Valid JSON, invalid config: still kept, the error names file and field.
    fs::write(&file, ours(9)).unwrap();
    let want = format!(
        "{}: plugins[0].mtu: must be between 68 and 65535, got 9",
        file.display()
    );
    let s = wait_for(&mut rx, "validation error", |s| error(s) == want).await;
    assert_eq!((mtu(&s), s.generation), (Some(1460), 1));

    // Fixed: loaded.
    fs::write(&file, ours(1400)).unwrap();
    assert_eq!(wait_loaded(&mut rx, &file, 1400).await.generation, 2);
}

#[tokio::test]
async fn broken_file_before_ours_blocks_switching_until_it_parses() {
    let d = dirs();
    let file = d.conf.join("10-pod.conflist");
    fs::write(&file, ours(1460)).unwrap();
    let (_w, mut rx) = ConfigWatcher::start(&d.conf).unwrap();

    // A new network being written before ours: not judged yet, nothing switches.
    let early = d.conf.join("05-pod.conflist");
    fs::write(&early, "{\"cniVersion\"").unwrap();
    let s = wait_for(&mut rx, "unsettled error", |s| {
        s.last_attempt.result.is_err()
    })
    .await;
    assert_eq!((mtu(&s), s.generation), (Some(1460), 1));
    assert_eq!(s.last_attempt.file.as_deref(), Some(early.as_path()));

    fs::write(&early, ours(1400)).unwrap();
    assert_eq!(wait_loaded(&mut rx, &early, 1400).await.generation, 2);
}

#[tokio::test]
async fn dir_removed_and_recreated() {
    let d = dirs();
    let file = d.conf.join("10-pod.conflist");
    fs::write(&file, ours(1460)).unwrap();
    let (_w, mut rx) = ConfigWatcher::start(&d.conf).unwrap();

    fs::remove_dir_all(&d.conf).unwrap();
    let s = wait_for(&mut rx, "not ready", |s| s.current.is_none()).await;
    assert!(error(&s).contains("cannot read directory"), "{}", error(&s));

    fs::create_dir(&d.conf).unwrap();
    fs::write(&file, ours(1400)).unwrap();
    assert_eq!(wait_loaded(&mut rx, &file, 1400).await.generation, 3);
}

#[tokio::test]
async fn single_file_mode() {
    let d = dirs();
    let file = d.conf.join("10-pod.conflist");
    let (w, mut rx) = ConfigWatcher::start(&file).unwrap();
    assert_eq!(w.path(), file);
    assert!(rx.borrow().current.is_none());

    // Other files in the dir do not matter.
    fs::write(d.conf.join("00-pod.conflist"), ours(1300)).unwrap();
    fs::write(d.staging.join("x"), ours(1460)).unwrap();
    fs::rename(d.staging.join("x"), &file).unwrap();
    assert_eq!(wait_loaded(&mut rx, &file, 1460).await.generation, 1);

    fs::write(&file, "").unwrap();
    let s = wait_for(&mut rx, "empty file error", |s| {
        s.last_attempt.result.is_err()
    })
    .await;
    assert_eq!(mtu(&s), Some(1460));

    fs::remove_file(&file).unwrap();
    let s = wait_for(&mut rx, "not ready", |s| s.current.is_none()).await;
    assert_eq!(s.generation, 2);
}
