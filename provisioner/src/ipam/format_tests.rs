//! The store's format: a store written before allocations named their pod opens, migrated.

#![expect(clippy::unwrap_used, reason = "a failing unwrap is a failing test")]

use std::collections::BTreeMap;
use std::path::Path;

use redb::{Database, TableDefinition};

use super::store::STORE_FILE;
use super::{Allocation, AllocationKey, Allocator, IpamConfig, STORE_FORMAT};
use crate::pod::Pod;

/// The ranges and network the fixture was written with (see its README).
const FIXTURE_RANGES: &str =
    r#"{"type":"host-local","ranges":[[{"subnet":"10.244.1.0/24"}],[{"subnet":"fd00:1::/64"}]]}"#;
const FIXTURE_NETWORK: &str = "pod-network";

fn open(dir: &Path) -> (Allocator, super::OpenReport) {
    let ranges = IpamConfig::from_json(FIXTURE_RANGES)
        .unwrap()
        .validate()
        .unwrap();
    Allocator::open(dir, FIXTURE_NETWORK, &ranges).unwrap()
}

/// A data dir holding a copy of the store fixture written without pods.
fn format1_store() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-v0/ipam.redb");
    std::fs::copy(&fixture, dir.path().join(STORE_FILE)).unwrap();
    dir
}

fn by_key(allocations: Vec<Allocation>) -> BTreeMap<String, (Vec<String>, Option<Pod>)> {
    allocations
        .into_iter()
        .map(|a| {
            let ips = a.ips.iter().map(|ip| ip.address.to_string()).collect();
            (a.key.container_id, (ips, a.pod))
        })
        .collect()
}

fn web0() -> Pod {
    Pod::from_cni_args(
        "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=u-0;K8S_POD_INFRA_CONTAINER_ID=sandbox-0",
    )
    .unwrap()
}

fn key(id: &str) -> AllocationKey {
    AllocationKey::new(id, "eth0")
}

#[test]
fn a_store_without_pods_keeps_its_addresses_and_the_next_add_records_the_pod() {
    let dir = format1_store();
    let (a, report) = open(dir.path());
    assert_eq!(report.migrated_from, Some(1));
    assert_eq!(report.allocations, 3);
    assert!(!report.ranges_changed, "same ranges as the fixture's");
    assert!(report.unreadable.is_empty(), "{:?}", report.unreadable);
    let addresses = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        by_key(a.list().unwrap()),
        BTreeMap::from([
            (
                "sandbox-0".to_owned(),
                (addresses(&["10.244.1.2/24", "fd00:1::2/64"]), None)
            ),
            (
                "sandbox-2".to_owned(),
                (addresses(&["10.244.1.4/24", "fd00:1::4/64"]), None)
            ),
            (
                "sandbox-3".to_owned(),
                (addresses(&["10.244.1.5/24", "fd00:1::5/64"]), None)
            ),
        ])
    );

    // The ADD of an existing sandbox, now naming its pod: same addresses, not new, pod kept.
    let reserved = a.reserve(&key("sandbox-0"), Some(&web0())).unwrap();
    assert!(!reserved.is_new());
    let added = reserved.wait_durable().unwrap();
    assert_eq!(added.pod, Some(web0()));
    assert_eq!(added.ips[0].address.to_string(), "10.244.1.2/24");
    // A repeated ADD without CNI_ARGS leaves the recorded pod.
    assert_eq!(a.allocate(&key("sandbox-0")).unwrap().pod, Some(web0()));
    // The old cursors and free list go on: a new sandbox gets the next address, not one held.
    let fresh = a.allocate_for(&key("sandbox-4"), Some(&web0())).unwrap();
    assert_eq!(fresh.ips[0].address.to_string(), "10.244.1.6/24");
    drop(a);

    let (a, report) = open(dir.path());
    assert_eq!(report.migrated_from, None, "migrated once");
    assert_eq!(report.allocations, 4);
    let after = by_key(a.list().unwrap());
    assert_eq!(after["sandbox-0"].1, Some(web0()), "the pod is on disk");
    assert_eq!(after["sandbox-2"].1, None);
}

#[test]
fn an_add_naming_another_pod_rewrites_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let (a, report) = open(dir.path());
    assert_eq!(report.migrated_from, None, "a new store is not a migration");
    let first = a.allocate_for(&key("c1"), Some(&web0())).unwrap();
    let mut web1 = web0();
    web1.name = "web-1".to_owned();
    let second = a
        .reserve(&key("c1"), Some(&web1))
        .unwrap()
        .wait_durable()
        .unwrap();
    assert_eq!(second.ips, first.ips);
    assert_eq!(a.get(&key("c1")).unwrap().unwrap().pod, Some(web1));
}

#[test]
fn a_store_of_a_newer_format_is_refused() {
    let dir = format1_store();
    drop(open(dir.path()));
    {
        let db = Database::open(dir.path().join(STORE_FILE)).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let name = format!("ipam/{FIXTURE_NETWORK}/meta");
            let mut meta = txn
                .open_table(TableDefinition::<&str, &[u8]>::new(&name))
                .unwrap();
            let newer = (STORE_FORMAT + 1).to_string();
            meta.insert("format", newer.as_bytes()).unwrap();
        }
        txn.commit().unwrap();
    }
    let ranges = IpamConfig::from_json(FIXTURE_RANGES)
        .unwrap()
        .validate()
        .unwrap();
    let Err(err) = Allocator::open(dir.path(), FIXTURE_NETWORK, &ranges) else {
        panic!("a newer format must be refused");
    };
    assert!(
        err.to_string().contains("newer than this binary's"),
        "{err}"
    );
}
