//! The node's container runtimes, as the node can ask them: their processes (command line and
//! configuration), where they serve CRI, and which pod a sandbox namespace belongs to. Knows
//! neither the kernel watch nor netlink.

pub mod bounded;
pub mod cri;
pub mod netns;
pub mod process;
pub mod resolver;
pub mod socket;

pub use resolver::CriResolver;
