//! The tests that load the whole machine: a build from scratch, bursts of thousands of
//! namespaces and of ADDs under a low descriptor limit, shutdown under a burst, stress and a
//! short soak. A binary of their own: cargo runs test binaries one after the other, so the
//! timing-sensitive tests of the `integration` binary never run beside these.

mod build_without_protoc;
mod fd_limit;
mod shutdown_burst;
mod soak;
mod stress;
mod trace_burst;
