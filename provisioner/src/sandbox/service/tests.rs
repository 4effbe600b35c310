//! The service's rules over recording fakes of the dataplane and the store (no root): what is
//! released after which failure, what the observer is told and when, GC and CHECK.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::dataplane::{CheckFailure, DataplaneError, LinkSpec, SetupStep};
use crate::ipam::{AllocatedIp, IpamConfig, IpamError, Reservation};
use crate::pod::Pod;

use super::*;

/// What the fake kernel does with the next calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Setup {
    #[default]
    Works,
    /// Fails and rolls back cleanly.
    FailsCleanly,
    /// Fails and its rollback leaves something behind.
    FailsDirty,
    /// Wires, but the check afterwards finds something missing.
    Unverified,
    /// The host veth is already there (a crashed ADD's) the first time, then it works.
    LeftoverOnce,
}

/// When the fake store's reservations become durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Durable {
    #[default]
    AtOnce,
    /// When the test says so (`Fixture::make_durable`).
    Later,
    /// Never: the commit fails.
    Fails,
}

#[derive(Default)]
struct Kernel {
    setup: Setup,
    teardown_fails: bool,
    /// Sandboxes wired now, by container id.
    wired: Vec<String>,
    /// Host veths of ours that no sandbox wired here owns.
    orphans: Vec<String>,
}

/// Records every call in `log`, shared with the store and the observer: one sequence.
#[derive(Clone)]
struct FakeDataplane {
    kernel: Arc<Mutex<Kernel>>,
    log: Log,
}

type Log = Arc<Mutex<Vec<String>>>;

fn say(log: &Log, what: String) {
    log.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(what);
}

fn io_error() -> DataplaneError {
    DataplaneError::Netlink {
        op: "fake".into(),
        netns: "fake".into(),
        source: std::io::Error::from_raw_os_error(libc::EBUSY),
    }
}

impl FakeDataplane {
    fn kernel(&self) -> std::sync::MutexGuard<'_, Kernel> {
        self.kernel.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl SandboxDataplane for FakeDataplane {
    /// The fake makes its veth pair (and meets a leftover) in `setup_and_check`, called by
    /// `finish_setup`: the log shows when the setup started.
    type Started = LinkSpec;

    async fn start_setup(&self, link: LinkSpec) -> Result<LinkSpec, DataplaneError> {
        say(&self.log, format!("start setup {}", link.container_id));
        Ok(link)
    }

    async fn finish_setup(
        &self,
        started: LinkSpec,
        spec: &SandboxSpec,
    ) -> Result<(SetupOutcome, Result<(), CheckFailure>), DataplaneError> {
        assert_eq!(
            started,
            LinkSpec::of(spec),
            "finished with another sandbox's spec"
        );
        self.setup_and_check(spec).await
    }

    async fn abandon_setup(&self, started: LinkSpec) -> Vec<DataplaneError> {
        say(&self.log, format!("abandon setup {}", started.container_id));
        Vec::new()
    }

    async fn setup_and_check(
        &self,
        spec: &SandboxSpec,
    ) -> Result<(SetupOutcome, Result<(), CheckFailure>), DataplaneError> {
        say(&self.log, format!("setup {}", spec.container_id));
        let mut kernel = self.kernel();
        let failed = |rollback_errors| DataplaneError::Setup {
            container_id: spec.container_id.clone(),
            step: SetupStep::SandboxRoutes,
            source: Box::new(io_error()),
            rollback_errors,
        };
        match kernel.setup {
            Setup::FailsCleanly => return Err(failed(Vec::new())),
            Setup::FailsDirty => return Err(failed(vec![io_error()])),
            Setup::LeftoverOnce => {
                kernel.setup = Setup::Works;
                return Err(DataplaneError::Setup {
                    container_id: spec.container_id.clone(),
                    step: SetupStep::CheckNames,
                    source: Box::new(DataplaneError::InterfaceExists {
                        ifname: host_ifname(&spec.container_id, &spec.ifname),
                        netns: "node".into(),
                    }),
                    rollback_errors: Vec::new(),
                });
            }
            Setup::Works | Setup::Unverified => {}
        }
        kernel.wired.push(spec.container_id.clone());
        let verified = if kernel.setup == Setup::Unverified {
            Err(CheckFailure {
                problems: vec!["route 0.0.0.0/0 missing".into()],
            })
        } else {
            Ok(())
        };
        Ok((
            SetupOutcome {
                host_ifname: host_ifname(&spec.container_id, &spec.ifname),
                host_ifindex: 3,
                host_mac: String::new(),
                sandbox_ifname: spec.ifname.clone(),
                sandbox_mac: String::new(),
                sandbox_ifindex: 2,
            },
            verified,
        ))
    }

    async fn teardown(
        &self,
        container_id: &str,
        _ifname: &str,
        _netns: Option<&Path>,
    ) -> Result<TeardownOutcome, DataplaneError> {
        say(&self.log, format!("teardown {container_id}"));
        let mut kernel = self.kernel();
        if kernel.teardown_fails {
            return Err(DataplaneError::Teardown {
                container_id: container_id.to_owned(),
                errors: vec![io_error()],
            });
        }
        kernel.wired.retain(|c| c != container_id);
        Ok(TeardownOutcome::default())
    }

    async fn check(&self, spec: &SandboxSpec) -> Result<(), CheckFailure> {
        say(&self.log, format!("check {}", spec.container_id));
        if self.kernel().wired.contains(&spec.container_id) {
            Ok(())
        } else {
            Err(CheckFailure {
                problems: vec![format!("link {} missing", spec.ifname)],
            })
        }
    }

    async fn sandbox_netns_of(
        &self,
        host_links: &[String],
    ) -> Result<HashMap<String, PathBuf>, DataplaneError> {
        Ok(host_links
            .iter()
            .map(|l| (l.clone(), PathBuf::from(format!("/run/netns/{l}"))))
            .collect())
    }

    async fn host_veths(&self) -> Result<Vec<String>, DataplaneError> {
        let kernel = self.kernel();
        Ok(kernel
            .wired
            .iter()
            .map(|c| host_ifname(c, "eth0"))
            .chain(kernel.orphans.iter().cloned())
            .collect())
    }

    async fn delete_host_link(&self, name: &str) -> Result<(), DataplaneError> {
        say(&self.log, format!("delete link {name}"));
        self.kernel().orphans.retain(|o| o != name);
        Ok(())
    }
}

/// Allocations in memory; `10.0.0.<n>/24` in order.
struct FakeStore {
    allocations: Mutex<BTreeMap<AllocationKey, Allocation>>,
    next: Mutex<u8>,
    log: Log,
    durable: Mutex<Durable>,
    /// The commit of the last reservation, in `Durable::Later` mode.
    commit: Mutex<Option<tokio::sync::oneshot::Sender<Result<(), IpamError>>>>,
    /// Keys whose records cannot be decoded.
    unreadable: Mutex<Vec<AllocationKey>>,
    /// Keys whose released addresses are held (`release_holding`, until `end_hold`).
    held: Mutex<Vec<AllocationKey>>,
    /// Every reservation is refused: the pool is exhausted.
    exhausted: Mutex<bool>,
}

impl FakeStore {
    fn holds(&self, container_id: &str) -> bool {
        self.allocations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&AllocationKey::new(container_id, "eth0"))
    }
}

impl AllocationStore for FakeStore {
    fn get(&self, key: &AllocationKey) -> Result<Option<Allocation>, IpamError> {
        Ok(self
            .allocations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned())
    }

    fn reserve(&self, key: &AllocationKey, pod: Option<&Pod>) -> Result<Reservation, IpamError> {
        if *self
            .exhausted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            say(&self.log, format!("exhausted for {}", key.container_id));
            return Err(IpamError::Exhausted {
                key: key.to_string(),
                range_sets: vec!["10.0.0.0/24".into()],
            });
        }
        let new = self.get(key)?.is_none();
        let mut allocation = self.allocate(key)?;
        if pod.is_some() {
            allocation.pod = pod.cloned();
            self.allocations
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key.clone(), allocation.clone());
        }
        let store = Path::new("fake");
        let mode = *self.durable.lock().unwrap_or_else(PoisonError::into_inner);
        if !new || mode == Durable::AtOnce {
            return Ok(Reservation::durable_already(allocation, new, store));
        }
        let (reservation, commit) = Reservation::pending(allocation, new, store);
        if mode == Durable::Fails {
            let _ = commit.send(Err(IpamError::Corrupt {
                path: store.into(),
                what: "commit".into(),
                reason: "injected".into(),
            }));
        } else {
            *self.commit.lock().unwrap_or_else(PoisonError::into_inner) = Some(commit);
        }
        Ok(reservation)
    }

    fn allocate(&self, key: &AllocationKey) -> Result<Allocation, IpamError> {
        say(&self.log, format!("allocate {}", key.container_id));
        let mut all = self
            .allocations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(existing) = all.get(key) {
            return Ok(existing.clone());
        }
        let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
        *next += 1;
        let address = IpNetwork::new([10, 0, 0, *next + 1].into(), 24).expect("a /24");
        let allocation = Allocation {
            key: key.clone(),
            ips: vec![AllocatedIp {
                address,
                gateway: [10, 0, 0, 1].into(),
            }],
            pod: None,
        };
        all.insert(key.clone(), allocation.clone());
        Ok(allocation)
    }

    fn release(&self, key: &AllocationKey) -> Result<Option<Allocation>, IpamError> {
        say(&self.log, format!("release {}", key.container_id));
        Ok(self
            .allocations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key))
    }

    fn release_holding(
        &self,
        key: &AllocationKey,
    ) -> impl Future<Output = Result<Option<Allocation>, IpamError>> + Send + 'static {
        let released = self
            .allocations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
        if released.is_some() {
            say(&self.log, format!("release {} held", key.container_id));
            self.held
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(key.clone());
        }
        std::future::ready(Ok(released))
    }

    fn end_hold(&self, key: &AllocationKey) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.contains(key) {
            held.retain(|k| k != key);
            say(&self.log, format!("end hold {}", key.container_id));
        }
    }

    fn reinstate(&self, allocation: &Allocation) -> Result<(), IpamError> {
        say(
            &self.log,
            format!("reinstate {}", allocation.key.container_id),
        );
        self.allocations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(allocation.key.clone(), allocation.clone());
        Ok(())
    }

    fn list(&self) -> Result<Vec<Allocation>, IpamError> {
        Ok(self
            .allocations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect())
    }

    fn unreadable_keys(&self) -> Result<Vec<AllocationKey>, IpamError> {
        Ok(self
            .unreadable
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone())
    }

    fn count(&self) -> Result<u64, IpamError> {
        Ok(self.list()?.len() as u64)
    }
}

/// Tells the shared log what the observer hears.
struct Recording(Log);

impl SandboxObserver for Recording {
    fn planned(&self, sandbox: &SandboxRef, _netns_cookie: Option<u64>, expected: &ExpectedState) {
        say(
            &self.0,
            format!(
                "observer planned {} {}",
                sandbox.container_id, expected.ifname
            ),
        );
    }
    fn set_up(&self, sandbox: &SandboxRef, _expected: &ExpectedState) {
        say(&self.0, format!("observer set up {}", sandbox.container_id));
    }
    fn rolled_back(&self, sandbox: &SandboxRef) {
        say(
            &self.0,
            format!("observer rolled back {}", sandbox.container_id),
        );
    }
    fn removing(&self, sandbox: &SandboxRef, cause: Removal) {
        say(
            &self.0,
            format!("observer removing {} {cause:?}", sandbox.container_id),
        );
    }
    fn removed(&self, sandbox: &SandboxRef, cause: Removal, released: Option<&Allocation>) {
        say(
            &self.0,
            format!(
                "observer removed {} {cause:?} released={}",
                sandbox.container_id,
                released.is_some()
            ),
        );
    }
    fn found(&self, sandbox: &SandboxRef, netns: Option<&Path>, _expected: &ExpectedState) {
        say(
            &self.0,
            format!(
                "observer found {} in {}",
                sandbox.container_id,
                netns.map_or_else(|| "?".into(), |p| p.display().to_string())
            ),
        );
    }
}

struct Fixture {
    service: SandboxService<FakeDataplane, FakeStore>,
    dataplane: FakeDataplane,
    store: Arc<FakeStore>,
    log: Log,
}

impl Fixture {
    fn new() -> Self {
        let log: Log = Arc::default();
        let dataplane = FakeDataplane {
            kernel: Arc::default(),
            log: Arc::clone(&log),
        };
        let store = Arc::new(FakeStore {
            allocations: Mutex::default(),
            next: Mutex::default(),
            log: Arc::clone(&log),
            durable: Mutex::default(),
            commit: Mutex::default(),
            unreadable: Mutex::default(),
            held: Mutex::default(),
            exhausted: Mutex::default(),
        });
        let ipam = IpamConfig::from_json(
            r#"{"ranges":[[{"subnet":"10.0.0.0/24"}]],"routes":[{"dst":"0.0.0.0/0"}]}"#,
        )
        .expect("test ipam");
        let network = Network::new("net", Some(1500), ipam).expect("test network");
        let service = SandboxService::with_observer(
            network,
            Arc::clone(&store),
            dataplane.clone(),
            Arc::new(KeyLocks::default()),
            Arc::new(Recording(Arc::clone(&log))),
        );
        Self {
            service,
            dataplane,
            store,
            log,
        }
    }

    fn log(&self) -> Vec<String> {
        std::mem::take(&mut *self.log.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

fn sandbox(container_id: &str) -> SandboxRef {
    SandboxRef {
        container_id: container_id.into(),
        ifname: "eth0".into(),
        netns: Some(PathBuf::from("/run/netns/x")),
        pod: None,
    }
}

#[tokio::test]
async fn add_starts_the_setup_while_reserving_and_tells_the_observer_its_plan_before_the_addresses_are_wired()
 {
    let f = Fixture::new();
    let outcome = f.service.add(&sandbox("c1")).await.expect("add");
    assert_eq!(outcome.expected.ifname, "eth0");
    assert_eq!(
        f.log(),
        [
            "allocate c1",
            "start setup c1",
            "observer planned c1 eth0",
            "setup c1",
            "observer set up c1"
        ]
    );
}

#[tokio::test]
async fn an_add_that_gets_no_address_undoes_the_setup_it_started() {
    let f = Fixture::new();
    *f.store
        .exhausted
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = true;
    let err = f.service.add(&sandbox("c1")).await.expect_err("fails");
    assert!(
        matches!(
            err,
            SandboxError::Ipam {
                source: IpamError::Exhausted { .. },
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        f.log(),
        ["exhausted for c1", "start setup c1", "abandon setup c1"]
    );
    assert!(f.dataplane.kernel().wired.is_empty());
}

#[tokio::test]
async fn a_failed_add_with_a_clean_rollback_releases_a_new_allocation() {
    let f = Fixture::new();
    f.dataplane.kernel().setup = Setup::FailsCleanly;
    let err = f.service.add(&sandbox("c1")).await.expect_err("fails");
    assert!(matches!(err, SandboxError::Dataplane { .. }), "{err}");
    assert!(!f.store.holds("c1"));
    assert_eq!(
        f.log(),
        [
            "allocate c1",
            "start setup c1",
            "observer planned c1 eth0",
            "setup c1",
            "observer rolled back c1",
            "release c1"
        ]
    );
}

#[tokio::test]
async fn a_failed_add_whose_rollback_left_something_keeps_the_address() {
    let f = Fixture::new();
    f.dataplane.kernel().setup = Setup::FailsDirty;
    f.service.add(&sandbox("c1")).await.expect_err("fails");
    assert!(f.store.holds("c1"), "its address may still be routed");
    assert!(!f.log().iter().any(|l| l == "release c1"));
}

#[tokio::test]
async fn a_failed_retry_never_releases_the_allocation_it_found() {
    let f = Fixture::new();
    f.service.add(&sandbox("c1")).await.expect("first add");
    f.dataplane.kernel().setup = Setup::FailsCleanly;
    f.service
        .add(&sandbox("c1"))
        .await
        .expect_err("retry fails");
    assert!(f.store.holds("c1"), "the allocation of the first ADD stays");
}

#[tokio::test]
async fn an_unverified_add_is_torn_down_and_released() {
    let f = Fixture::new();
    f.dataplane.kernel().setup = Setup::Unverified;
    let err = f.service.add(&sandbox("c1")).await.expect_err("fails");
    assert!(matches!(err, SandboxError::Verify { .. }), "{err}");
    assert!(!f.store.holds("c1"));
    let log = f.log();
    assert_eq!(
        &log[4..],
        ["observer rolled back c1", "teardown c1", "release c1"]
    );
}

#[tokio::test]
async fn del_releases_during_the_teardown_and_holds_the_addresses_until_it_is_done() {
    let f = Fixture::new();
    f.service.add(&sandbox("c1")).await.expect("add");
    f.log();
    let outcome = f.service.del(&sandbox("c1")).await.expect("del");
    assert!(outcome.released.is_some());
    assert_eq!(
        f.log(),
        [
            "observer removing c1 Del",
            "release c1 held",
            "teardown c1",
            "end hold c1",
            "observer removed c1 Del released=true"
        ]
    );
    let again = f.service.del(&sandbox("c1")).await.expect("idempotent");
    assert!(again.released.is_none());
}

#[tokio::test]
async fn a_failed_teardown_keeps_the_allocation_for_the_retry() {
    let f = Fixture::new();
    f.service.add(&sandbox("c1")).await.expect("add");
    f.dataplane.kernel().teardown_fails = true;
    f.log();
    let err = f.service.del(&sandbox("c1")).await.expect_err("fails");
    assert!(matches!(err, SandboxError::Dataplane { .. }), "{err}");
    assert!(f.store.holds("c1"));
    assert_eq!(
        f.log(),
        [
            "observer removing c1 Del",
            "release c1 held",
            "teardown c1",
            "reinstate c1",
            "end hold c1"
        ]
    );
    f.dataplane.kernel().teardown_fails = false;
    f.service
        .del(&sandbox("c1"))
        .await
        .expect("the retry finishes");
    assert!(!f.store.holds("c1"));
}

#[tokio::test]
async fn gc_removes_what_the_runtime_no_longer_lists_and_skips_work_in_flight() {
    let f = Fixture::new();
    for c in ["keep", "gone", "busy"] {
        f.service.add(&sandbox(c)).await.expect("add");
    }
    let held = f.service.locks.lock("busy", "eth0").await;
    let outcome = f
        .service
        .gc(&[AllocationKey::new("keep", "eth0")])
        .await
        .expect("gc");
    drop(held);
    assert_eq!(outcome.released, [AllocationKey::new("gone", "eth0")]);
    assert_eq!(outcome.in_flight, [AllocationKey::new("busy", "eth0")]);
    assert!(f.store.holds("keep") && f.store.holds("busy") && !f.store.holds("gone"));
    assert!(f.log().iter().any(|l| l == "observer removing gone Gc"));
}

#[tokio::test]
async fn check_compares_the_runtimes_prev_result_with_the_allocation() {
    let f = Fixture::new();
    let added = f.service.add(&sandbox("c1")).await.expect("add");
    let mine: Vec<IpNetwork> = added.allocation.ips.iter().map(|ip| ip.address).collect();
    f.service
        .check(&sandbox("c1"), Some(&mine))
        .await
        .expect("matches");
    let other: Vec<IpNetwork> = vec!["10.0.0.200/24".parse().expect("net")];
    let err = f
        .service
        .check(&sandbox("c1"), Some(&other))
        .await
        .expect_err("differs");
    assert!(
        matches!(&err, SandboxError::PrevResultMismatch { claimed, .. } if claimed == "10.0.0.200/24"),
        "{err}"
    );
    let missing = f
        .service
        .check(&sandbox("nope"), None)
        .await
        .expect_err("none");
    assert!(
        matches!(missing, SandboxError::NotFound { .. }),
        "{missing}"
    );
}

#[tokio::test]
async fn announce_existing_hands_every_allocation_with_its_netns_to_the_observer() {
    let f = Fixture::new();
    f.service.add(&sandbox("c1")).await.expect("add");
    f.log();
    assert_eq!(f.service.announce_existing().await.expect("announce"), 1);
    let link = host_ifname("c1", "eth0");
    assert_eq!(f.log(), [format!("observer found c1 in /run/netns/{link}")]);
}

#[tokio::test]
async fn release_gone_is_told_as_netns_gone() {
    let f = Fixture::new();
    f.service.add(&sandbox("c1")).await.expect("add");
    f.log();
    f.service
        .release_gone(&AllocationKey::new("c1", "eth0"))
        .await
        .expect("release");
    assert!(!f.store.holds("c1"));
    assert_eq!(
        f.log().last().map(String::as_str),
        Some("observer removed c1 NetnsGone released=true")
    );
}

impl Fixture {
    fn set_durable(&self, mode: Durable) {
        *self
            .store
            .durable
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = mode;
    }

    fn make_durable(&self) {
        let commit = self
            .store
            .commit
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .expect("a reservation waits for its commit");
        commit.send(Ok(())).expect("the ADD awaits durability");
    }

    fn adopt(&self, host_link: &str, last_octet: u8) {
        let key = AllocationKey::adopted(host_link);
        let allocation = Allocation {
            key: key.clone(),
            ips: vec![AllocatedIp {
                address: IpNetwork::new([10, 0, 0, last_octet].into(), 24).expect("a /24"),
                gateway: [10, 0, 0, 1].into(),
            }],
            pod: None,
        };
        self.store
            .allocations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, allocation);
    }

    fn holds_adopted(&self, host_link: &str) -> bool {
        self.store
            .allocations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&AllocationKey::adopted(host_link))
    }
}

#[tokio::test]
async fn add_wires_while_the_commit_runs_and_answers_only_once_it_is_durable() {
    let f = Fixture::new();
    f.set_durable(Durable::Later);
    let service = f.service.clone();
    let add = tokio::spawn(async move { service.add(&sandbox("c1")).await });
    // Bounded poll: the reservation is made on a blocking thread.
    let mut wired = false;
    for _ in 0..5000 {
        if f.dataplane.kernel().wired.contains(&"c1".to_owned()) {
            wired = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    assert!(wired, "setup did not start before durability");
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(
        !add.is_finished(),
        "ADD answered before its allocation was durable"
    );
    f.make_durable();
    add.await.expect("join").expect("add");
    assert_eq!(
        f.log(),
        [
            "allocate c1",
            "start setup c1",
            "observer planned c1 eth0",
            "setup c1",
            "observer set up c1"
        ]
    );
}

#[tokio::test]
async fn add_whose_commit_fails_undoes_the_wiring_and_fails() {
    let f = Fixture::new();
    f.set_durable(Durable::Fails);
    let err = f
        .service
        .add(&sandbox("c1"))
        .await
        .expect_err("not durable");
    assert!(matches!(err, SandboxError::Ipam { .. }), "{err}");
    assert_eq!(
        f.log(),
        [
            "allocate c1",
            "start setup c1",
            "observer planned c1 eth0",
            "setup c1",
            "observer rolled back c1",
            "teardown c1"
        ]
    );
    assert!(f.dataplane.kernel().wired.is_empty());
}

#[tokio::test]
async fn add_replaces_a_leftover_host_veth_and_frees_what_was_adopted_from_it() {
    let f = Fixture::new();
    let link = host_ifname("c1", "eth0");
    f.adopt(&link, 200);
    f.dataplane.kernel().setup = Setup::LeftoverOnce;
    f.service.add(&sandbox("c1")).await.expect("add");
    assert!(!f.holds_adopted(&link), "adopted address still reserved");
    assert!(f.store.holds("c1"));
    assert_eq!(
        f.log(),
        [
            "allocate c1".to_owned(),
            "start setup c1".to_owned(),
            "observer planned c1 eth0".to_owned(),
            "setup c1".to_owned(),
            "teardown c1".to_owned(),
            format!("release adopted:{link}"),
            "setup c1".to_owned(),
            "observer set up c1".to_owned(),
        ]
    );
}

#[tokio::test]
async fn del_frees_what_was_adopted_from_its_host_veth() {
    let f = Fixture::new();
    let link = host_ifname("c1", "eth0");
    f.adopt(&link, 200);
    f.service.del(&sandbox("c1")).await.expect("del");
    assert!(!f.holds_adopted(&link));
}

#[tokio::test]
async fn gc_keeps_what_was_adopted_from_listed_sandboxes_and_removes_the_rest() {
    let f = Fixture::new();
    let listed = host_ifname("c1", "eth0");
    f.adopt(&listed, 200);
    f.adopt("pvn0123456789ab", 201);
    let outcome = f
        .service
        .gc(&[AllocationKey::new("c1", "eth0")])
        .await
        .expect("gc");
    assert_eq!(
        outcome.released,
        [AllocationKey::adopted("pvn0123456789ab")]
    );
    assert!(f.holds_adopted(&listed));
    assert!(f.log().contains(&"delete link pvn0123456789ab".to_owned()));
}

#[tokio::test]
async fn gc_removes_host_veths_nothing_owns_but_not_those_of_operations_in_flight() {
    let f = Fixture::new();
    f.service.add(&sandbox("c1")).await.expect("add");
    let in_flight = host_ifname("c2", "eth0");
    let listed = host_ifname("c3", "eth0");
    f.dataplane.kernel().orphans = vec![
        "pvn0123456789ab".to_owned(),
        in_flight.clone(),
        listed.clone(),
    ];
    let _adding = f.service.locks.lock("c2", "eth0").await;
    let outcome = f
        .service
        .gc(&[
            AllocationKey::new("c1", "eth0"),
            AllocationKey::new("c3", "eth0"),
        ])
        .await
        .expect("gc");
    assert_eq!(outcome.orphan_links, ["pvn0123456789ab"]);
    assert_eq!(f.dataplane.kernel().orphans, [in_flight, listed]);
    assert!(f.store.holds("c1"));
}

#[tokio::test]
async fn gc_leaves_the_host_veth_of_an_unreadable_record_alone() {
    let f = Fixture::new();
    let bad = AllocationKey::new("bad", "eth0");
    f.store
        .unreadable
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(bad);
    let link = host_ifname("bad", "eth0");
    f.dataplane.kernel().orphans = vec![link.clone()];
    let outcome = f.service.gc(&[]).await.expect("gc");
    assert!(outcome.orphan_links.is_empty());
    assert_eq!(f.dataplane.kernel().orphans, [link]);
}
