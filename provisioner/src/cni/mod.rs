//! The CNI protocol: versions, env + stdin parsing, result and error shapes, codes.

pub mod error;
pub mod version;
