//! What the sandbox service tells an observer about what it does (the kernel watch is one:
//! it checks each setup against the kernel and knows a teardown is not drift).

use std::path::Path;

use crate::dataplane::ExpectedState;
use crate::ipam::Allocation;

use super::SandboxRef;

/// Why a sandbox's network is removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    /// The runtime's DEL.
    Del,
    /// The runtime's GC: no attachment of the runtime names it any more.
    Gc,
    /// Reconciliation at start: its namespace (and with it the veth pair) is gone.
    NetnsGone,
}

/// Told of every change the service makes; every method has a no-op default.
pub trait SandboxObserver: Send + Sync {
    /// ADD reserved the addresses and is about to wire `expected` in `sandbox.netns` (the
    /// veth pair may be made already, none of the addresses and routes is); `netns_cookie` is
    /// that namespace's cookie when the dataplane knows it.
    fn planned(
        &self,
        _sandbox: &SandboxRef,
        _netns_cookie: Option<u64>,
        _expected: &ExpectedState,
    ) {
    }
    /// ADD finished: the sandbox is wired and verified.
    fn set_up(&self, _sandbox: &SandboxRef, _expected: &ExpectedState) {}
    /// ADD failed; what it wired was rolled back.
    fn rolled_back(&self, _sandbox: &SandboxRef) {}
    /// The sandbox's network is about to be torn down on purpose.
    fn removing(&self, _sandbox: &SandboxRef, _cause: Removal) {}
    /// The teardown finished; `released` (when it held one) is free again.
    fn removed(&self, _sandbox: &SandboxRef, _cause: Removal, _released: Option<&Allocation>) {}
    /// Found at start: a sandbox this network holds an allocation for, with its namespace
    /// file when one was found, and what it must have.
    fn found(&self, _sandbox: &SandboxRef, _netns: Option<&Path>, _expected: &ExpectedState) {}
}

/// An observer that does nothing (the in-process CLI mode).
pub struct NoObserver;

impl SandboxObserver for NoObserver {}
