//! Generates the CRI messages and clients from proto/api.proto with a protobuf compiler written
//! in Rust (protox): no `protoc` on the build machine.

use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = Path::new("proto/api.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        // The clients are built on a channel of the caller's (a unix socket), not `connect`.
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
