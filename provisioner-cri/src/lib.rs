//! The Kubernetes Container Runtime Interface, API version `runtime.v1`: its messages and the
//! clients of its two services, generated at build time from `proto/api.proto` (the
//! `api.proto` of k8s.io/cri-api, as published with the `k8s-cri` crate 0.11) by protox, a
//! protobuf compiler written in Rust. Nothing but the Rust toolchain is needed to build it.

#[expect(
    clippy::doc_lazy_continuation,
    clippy::doc_overindented_list_items,
    reason = "the generated docs are the proto file's comments as written"
)]
pub mod v1 {
    tonic::include_proto!("runtime.v1");
}
