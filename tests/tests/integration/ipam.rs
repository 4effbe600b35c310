//! IPAM allocator against a real redb file in a temp dir (no root needed).
#![expect(clippy::unwrap_used, reason = "a failing unwrap is a failing test")]

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use provisioner::ipam::{AllocationKey, Allocator, IpamConfig, IpamError, RangeSets};

fn ranges(json: &str) -> RangeSets {
    IpamConfig::from_json(json).unwrap().validate().unwrap()
}

fn key(i: usize) -> AllocationKey {
    AllocationKey::new(format!("c{i:04}"), "eth0")
}

fn open(dir: &std::path::Path, json: &str) -> Allocator {
    let (a, report) = Allocator::open(dir, "pod-network", &ranges(json)).unwrap();
    assert!(report.unreadable.is_empty(), "{report:?}");
    a
}

const V4_28: &str = r#"{"subnet":"10.244.1.0/28"}"#;

#[test]
fn slash_28_exhaustion_and_release() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path(), V4_28);
    let mut seen = HashSet::new();
    for i in 0..13 {
        let al = a.allocate(&key(i)).unwrap();
        assert_eq!(al.ips.len(), 1);
        let ip = al.ips[0];
        assert_eq!(ip.address.prefix(), 28);
        assert_eq!(ip.gateway, "10.244.1.1".parse::<IpAddr>().unwrap());
        assert!(
            !["10.244.1.0", "10.244.1.1", "10.244.1.15"]
                .contains(&ip.address.ip().to_string().as_str()),
            "{ip:?}"
        );
        assert!(seen.insert(ip.address.ip()), "duplicate {ip:?}");
    }
    let err = a.allocate(&key(13)).unwrap_err();
    assert!(matches!(err, IpamError::Exhausted { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("no IP addresses available in range set") && msg.contains("10.244.1.0/28"),
        "{msg}"
    );
    assert!(a.get(&key(13)).unwrap().is_none(), "no partial state");
    assert_eq!(a.count().unwrap(), 13);

    let freed = a.release(&key(4)).unwrap().unwrap();
    let again = a.allocate(&key(13)).unwrap();
    assert_eq!(
        again.ips[0].address, freed.ips[0].address,
        "the only free address is reused"
    );
    assert!(a.allocate(&key(14)).is_err());

    // Released addresses come back oldest release first.
    let r1 = a.release(&key(9)).unwrap().unwrap();
    let r2 = a.release(&key(2)).unwrap().unwrap();
    assert_eq!(a.allocate(&key(20)).unwrap().ips, r1.ips);
    assert_eq!(a.allocate(&key(21)).unwrap().ips, r2.ips);
}

#[test]
fn allocate_is_idempotent_and_released_ips_come_back_late() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path(), V4_28);
    let first = a.allocate(&key(1)).unwrap();
    assert_eq!(a.allocate(&key(1)).unwrap(), first);
    assert_eq!(a.count().unwrap(), 1);
    // Same container, other interface: a different allocation.
    let other = a.allocate(&AllocationKey::new("c0001", "net1")).unwrap();
    assert_ne!(other.ips[0].address, first.ips[0].address);
    // A released address is not handed out again while never-used ones remain.
    a.release(&key(1)).unwrap().unwrap();
    let next = a.allocate(&key(2)).unwrap();
    assert_ne!(next.ips[0].address, first.ips[0].address);
    assert_eq!(next.ips[0].address.ip().to_string(), "10.244.1.4");
}

#[test]
fn release_unknown_key_is_ok() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path(), V4_28);
    assert!(a.release(&key(99)).unwrap().is_none());
    a.allocate(&key(1)).unwrap();
    assert!(a.release(&key(1)).unwrap().is_some());
    assert!(a.release(&key(1)).unwrap().is_none());
    assert_eq!(a.count().unwrap(), 0);
}

#[test]
fn reopen_after_100_allocations_restores_everything() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = r#"{"subnet":"10.244.0.0/22"}"#;
    let before: Vec<_> = {
        let a = open(dir.path(), cfg);
        (0..100).map(|i| a.allocate(&key(i)).unwrap()).collect()
    };
    let (a, report) = Allocator::open(dir.path(), "pod-network", &ranges(cfg)).unwrap();
    assert_eq!(report.allocations, 100);
    assert!(!report.ranges_changed);
    assert!(report.out_of_range.is_empty());
    assert_eq!(a.count().unwrap(), 100);
    let list = a.list().unwrap();
    let distinct: HashSet<_> = list.iter().map(|al| al.ips[0].address.ip()).collect();
    assert_eq!(distinct.len(), 100);
    for (i, b) in before.iter().enumerate() {
        assert_eq!(a.get(&key(i)).unwrap().as_ref(), Some(b));
        assert_eq!(&a.allocate(&key(i)).unwrap(), b);
    }
    // New allocations do not collide with restored ones.
    let new = a.allocate(&key(100)).unwrap();
    assert!(!distinct.contains(&new.ips[0].address.ip()));
}

#[test]
fn dual_stack_gives_one_v4_and_one_v6() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(
        dir.path(),
        r#"{"ranges":[[{"subnet":"10.244.1.0/24"}],[{"subnet":"fd00:244:1::/64"}]]}"#,
    );
    let al = a.allocate(&key(1)).unwrap();
    assert_eq!(al.ips.len(), 2);
    assert_eq!(al.ips[0].address.to_string(), "10.244.1.2/24");
    assert_eq!(al.ips[0].gateway.to_string(), "10.244.1.1");
    assert_eq!(al.ips[1].address.to_string(), "fd00:244:1::2/64");
    assert_eq!(al.ips[1].gateway.to_string(), "fd00:244:1::1");
}

#[test]
fn dual_stack_exhaustion_leaves_no_partial_state() {
    let dir = tempfile::tempdir().unwrap();
    // v4 has 13 addresses, v6 /126 has 2 (::1 gateway, ::2, ::3).
    let a = open(
        dir.path(),
        r#"{"ranges":[[{"subnet":"10.244.1.0/28"}],[{"subnet":"fd00::/126"}]]}"#,
    );
    a.allocate(&key(1)).unwrap();
    a.allocate(&key(2)).unwrap();
    let err = a.allocate(&key(3)).unwrap_err().to_string();
    assert!(
        err.contains("fd00::/126") && !err.contains("10.244.1.0/28"),
        "{err}"
    );
    assert!(a.get(&key(3)).unwrap().is_none());
    // The v4 address that would have been taken is still free: releasing one key makes room
    // and the next v4 address is the one after key 2's.
    a.release(&key(1)).unwrap();
    let al = a.allocate(&key(3)).unwrap();
    assert_eq!(al.ips[0].address.ip().to_string(), "10.244.1.4");
    assert_eq!(al.ips[1].address.ip().to_string(), "fd00::2");
}

#[test]
fn reopen_with_other_ranges_reports_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    {
        let a = open(dir.path(), r#"{"subnet":"10.244.1.0/24"}"#);
        for i in 0..10 {
            a.allocate(&key(i)).unwrap(); // .2 ..= .11
        }
    }
    // Shrink the range to .2-.6: keys 5..10 (.7-.11) are now outside.
    let narrow = r#"{"subnet":"10.244.1.0/24","rangeStart":"10.244.1.2","rangeEnd":"10.244.1.6"}"#;
    let (a, report) = Allocator::open(dir.path(), "pod-network", &ranges(narrow)).unwrap();
    assert!(report.ranges_changed);
    assert_eq!(report.allocations, 10);
    let mut out: Vec<_> = report
        .out_of_range
        .iter()
        .map(|al| al.key.clone())
        .collect();
    out.sort();
    assert_eq!(out, (5..10).map(key).collect::<Vec<_>>());
    // Kept reserved and still returned for their keys.
    assert_eq!(a.count().unwrap(), 10);
    assert_eq!(
        a.allocate(&key(7)).unwrap().ips[0].address.ip().to_string(),
        "10.244.1.9"
    );
    // The narrow range is full (its five addresses are held by keys 0..5).
    assert!(a.allocate(&key(50)).is_err());
    // Releasable by key; an out-of-range address is not put back in the pool.
    assert!(a.release(&key(7)).unwrap().is_some());
    assert!(a.allocate(&key(50)).is_err());
    a.release(&key(0)).unwrap();
    assert_eq!(
        a.allocate(&key(50)).unwrap().ips[0]
            .address
            .ip()
            .to_string(),
        "10.244.1.2"
    );
    drop(a);
    // Widening again: the cursor restarts, skips every reserved address and finds .11's neighbours.
    let (a, report) = Allocator::open(
        dir.path(),
        "pod-network",
        &ranges(r#"{"subnet":"10.244.1.0/24"}"#),
    )
    .unwrap();
    assert!(report.out_of_range.is_empty());
    let held: HashSet<_> = a
        .list()
        .unwrap()
        .iter()
        .map(|al| al.ips[0].address.ip())
        .collect();
    let al = a.allocate(&key(60)).unwrap();
    assert!(!held.contains(&al.ips[0].address.ip()));
    assert_eq!(
        al.ips[0].address.ip().to_string(),
        "10.244.1.9",
        "freed while out of range"
    );
}

#[test]
fn networks_share_a_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let r = ranges(V4_28);
    let (a, _) = Allocator::open(dir.path(), "net-a", &r).unwrap();
    let (b, _) = Allocator::open(dir.path(), "net-b", &r).unwrap();
    assert_eq!(a.allocate(&key(1)).unwrap(), b.allocate(&key(1)).unwrap());
    assert_eq!(a.path(), b.path());
    assert_eq!(a.count().unwrap(), 1);
}

#[test]
fn unreadable_store_is_kept_aside_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ipam.redb");
    std::fs::write(&path, vec![0x5a_u8; 8192]).unwrap();
    let (a, report) = Allocator::open(dir.path(), "pod-network", &ranges(V4_28)).unwrap();
    let lost = report.lost.expect("reported as lost");
    assert!(lost.contains(&path.display().to_string()), "{lost}");
    assert!(lost.contains("kept aside as"), "{lost}");
    assert_eq!(a.count().unwrap(), 0);
    let kept: Vec<Vec<u8>> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("ipam.redb.broken-"))
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    assert_eq!(kept, vec![vec![0x5a_u8; 8192]]);
}

#[test]
fn data_dir_is_created_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("a/b");
    let (_a, report) = Allocator::open(&data, "pod-network", &ranges(V4_28)).unwrap();
    assert!(report.path.starts_with(data.canonicalize().unwrap()));
    let mode = std::fs::metadata(&data).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
}

#[test]
fn concurrent_16_threads_x_50_keys_all_distinct() {
    let dir = tempfile::tempdir().unwrap();
    let a = Arc::new(open(dir.path(), r#"{"subnet":"10.244.0.0/22"}"#));
    let handles: Vec<_> = (0..16)
        .map(|t| {
            let a = Arc::clone(&a);
            std::thread::spawn(move || {
                (0..50)
                    .map(|k| {
                        let key = AllocationKey::new(format!("t{t}-k{k}"), "eth0");
                        a.allocate(&key).unwrap().ips[0].address.ip()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut all = HashSet::new();
    for h in handles {
        for ip in h.join().unwrap() {
            assert!(all.insert(ip), "duplicate {ip}");
        }
    }
    assert_eq!(all.len(), 800);
    assert_eq!(a.count().unwrap(), 800);
}

#[test]
fn v6_slash_64_is_quick() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path(), r#"{"ranges":[[{"subnet":"fd00:244:1::/64"}]]}"#);
    let t0 = Instant::now();
    for i in 0..20 {
        let al = a.allocate(&key(i)).unwrap();
        assert_eq!(al.ips[0].address.prefix(), 64);
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

/// Runs the calling test (`test`, its name in this module) again in a child process (the same
/// test binary, only that test) with `var` set to `dir`: the test sees the variable and plays
/// the child's part.
fn rerun_as_child(test: &str, var: &str, dir: &std::path::Path) -> std::process::Command {
    // libtest names a test by its path below the crate: `ipam::<test>`.
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", &format!("{module}::{test}")])
        .args(["--test-threads=1", "--nocapture"])
        .env(var, dir);
    cmd
}

/// The child's part of `crash_after_commit_keeps_allocations`: allocates, then dies without
/// any cleanup (no drop, no close), like a daemon killed mid-flight.
fn allocate_then_abort(dir: &std::path::Path) -> ! {
    let a = open(dir, r#"{"subnet":"10.244.0.0/22"}"#);
    for i in 0..50 {
        a.allocate(&key(i)).unwrap();
    }
    a.release(&key(7)).unwrap();
    std::process::abort();
}

const CRASH_CHILD_DIR: &str = "IPAM_CRASH_CHILD_DIR";

#[test]
fn crash_after_commit_keeps_allocations() {
    if let Some(dir) = std::env::var_os(CRASH_CHILD_DIR) {
        allocate_then_abort(std::path::Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    let status = rerun_as_child(
        "crash_after_commit_keeps_allocations",
        CRASH_CHILD_DIR,
        dir.path(),
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .status()
    .unwrap();
    assert!(!status.success(), "child must die by abort");
    let (a, report) = Allocator::open(
        dir.path(),
        "pod-network",
        &ranges(r#"{"subnet":"10.244.0.0/22"}"#),
    )
    .unwrap();
    assert_eq!(report.allocations, 49);
    assert!(a.get(&key(7)).unwrap().is_none());
    let held: HashSet<_> = a
        .list()
        .unwrap()
        .iter()
        .map(|al| al.ips[0].address.ip())
        .collect();
    assert_eq!(held.len(), 49);
    let new = a.allocate(&key(100)).unwrap();
    assert!(!held.contains(&new.ips[0].address.ip()));
}

/// The child's part of `crash_during_concurrent_allocations_keeps_every_answer`: 16 threads allocate
/// (and release every fifth key), print each answer as soon as it returns, and one of them aborts
/// the process while the others are mid-call.
fn allocate_concurrently_then_abort(dir: &std::path::Path) -> ! {
    use std::io::Write;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let a = Arc::new(open(dir, r#"{"subnet":"10.244.0.0/22"}"#));
    // The test harness's "test <name> ... " has no line end yet: start the answers on a line
    // of their own.
    std::io::stdout().write_all(b"\n").unwrap();
    let answered = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let (a, answered) = (Arc::clone(&a), Arc::clone(&answered));
            std::thread::spawn(move || {
                for k in 0..50 {
                    let key = AllocationKey::new(format!("t{t}-k{k}"), "eth0");
                    let al = a.allocate(&key).unwrap();
                    let mut line = format!("ALLOC {} {}\n", key.container_id, al.ips[0].address);
                    if k % 5 == 0 {
                        a.release(&key).unwrap().unwrap();
                        line.push_str(&format!("RELEASE {}\n", key.container_id));
                    }
                    {
                        let mut out = std::io::stdout().lock();
                        out.write_all(line.as_bytes()).unwrap();
                        out.flush().unwrap();
                    }
                    if answered.fetch_add(1, Ordering::SeqCst) + 1 == 300 {
                        std::process::abort();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    std::process::abort();
}

const CRASH_CONCURRENT_DIR: &str = "IPAM_CRASH_CONCURRENT_DIR";

#[test]
fn crash_during_concurrent_allocations_keeps_every_answer() {
    if let Some(dir) = std::env::var_os(CRASH_CONCURRENT_DIR) {
        allocate_concurrently_then_abort(std::path::Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    let out = rerun_as_child(
        "crash_during_concurrent_allocations_keeps_every_answer",
        CRASH_CONCURRENT_DIR,
        dir.path(),
    )
    .stderr(std::process::Stdio::null())
    .output()
    .unwrap();
    assert!(!out.status.success(), "child must die by abort");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let mut answered = std::collections::HashMap::new();
    let mut released = HashSet::new();
    for line in stdout.lines() {
        match line.split_whitespace().collect::<Vec<_>>()[..] {
            ["ALLOC", cid, ip] => {
                assert!(answered.insert(cid.to_string(), ip.to_string()).is_none());
            }
            ["RELEASE", cid] => {
                assert!(released.insert(cid.to_string()));
            }
            _ => {}
        }
    }
    // The child aborts once 300 answers were counted; what matters below is that every answer it
    // printed survived the crash (how many made it to the pipe first varies with load).
    assert!(answered.len() >= 100, "{} answers", answered.len());
    let (a, report) = Allocator::open(
        dir.path(),
        "pod-network",
        &ranges(r#"{"subnet":"10.244.0.0/22"}"#),
    )
    .unwrap();
    assert!(report.unreadable.is_empty());
    for (cid, ip) in &answered {
        let got = a.get(&AllocationKey::new(cid.clone(), "eth0")).unwrap();
        if released.contains(cid) {
            assert!(got.is_none(), "{cid} was released before the crash");
        } else {
            let got = got.unwrap_or_else(|| panic!("{cid} answered {ip} but lost"));
            assert_eq!(got.ips[0].address.to_string(), *ip, "{cid}");
        }
    }
    // Unanswered calls may or may not have committed; either way no address is held twice.
    let list = a.list().unwrap();
    let distinct: HashSet<_> = list.iter().map(|al| al.ips[0].address.ip()).collect();
    assert_eq!(distinct.len(), list.len());
    assert!(list.len() >= answered.len() - released.len());
    let new = a.allocate(&key(9999)).unwrap();
    assert!(!distinct.contains(&new.ips[0].address.ip()));
}

#[test]
fn concurrent_exhaustion_fails_only_the_callers_left_without_an_address() {
    let dir = tempfile::tempdir().unwrap();
    let a = Arc::new(open(dir.path(), V4_28)); // 13 addresses
    let barrier = Arc::new(std::sync::Barrier::new(16));
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let (a, barrier) = (Arc::clone(&a), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                a.allocate(&key(i))
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let ok: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    let exhausted = results
        .iter()
        .filter(|r| matches!(r, Err(IpamError::Exhausted { .. })))
        .count();
    assert_eq!((ok.len(), exhausted), (13, 3));
    let distinct: HashSet<_> = ok.iter().map(|al| al.ips[0].address.ip()).collect();
    assert_eq!(distinct.len(), 13);
    assert_eq!(a.count().unwrap(), 13);
    for al in ok {
        assert_eq!(a.get(&al.key).unwrap().as_ref(), Some(al));
    }
}

#[test]
fn concurrent_allocates_of_one_key_get_one_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let a = Arc::new(open(dir.path(), V4_28));
    let barrier = Arc::new(std::sync::Barrier::new(16));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (a, barrier) = (Arc::clone(&a), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                a.allocate(&key(1)).unwrap()
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(results.iter().all(|r| *r == results[0]), "{results:?}");
    assert_eq!(a.count().unwrap(), 1);
}

#[test]
fn existing_data_dir_and_store_file_are_made_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    drop(open(&data, V4_28));
    let store = data.join("ipam.redb");
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    drop(open(&data, V4_28));
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700);
    assert_eq!(mode(&store), 0o600);
}

#[test]
fn a_deleted_or_emptied_store_file_is_reported_lost_not_silently_new() {
    let dir = tempfile::tempdir().unwrap();
    let r = ranges(V4_28);
    let (a, report) = Allocator::open(dir.path(), "pod-network", &r).unwrap();
    assert!(report.lost.is_none(), "a first start loses nothing");
    a.allocate(&key(1)).unwrap();
    drop(a);
    let store = dir.path().join("ipam.redb");
    std::fs::remove_file(&store).unwrap();
    let (a, report) = Allocator::open(dir.path(), "pod-network", &r).unwrap();
    let lost = report.lost.expect("a deleted store is reported lost");
    assert!(
        lost.contains("missing") && lost.contains(&store.display().to_string()),
        "{lost}"
    );
    drop(a);
    std::fs::File::create(&store).unwrap(); // truncated to zero bytes
    let (_a, report) = Allocator::open(dir.path(), "pod-network", &r).unwrap();
    let lost = report.lost.expect("an emptied store is reported lost");
    assert!(lost.contains("empty"), "{lost}");
}

#[test]
fn a_reopen_on_the_same_boot_says_so() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), V4_28));
    let (_a, report) = Allocator::open(dir.path(), "pod-network", &ranges(V4_28)).unwrap();
    assert!(report.same_boot);
}
