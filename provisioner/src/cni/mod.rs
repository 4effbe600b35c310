//! The CNI protocol: versions, env + stdin parsing, result and error shapes, codes.

pub mod conf;
pub mod env;
pub mod error;
pub mod result;
pub mod version;
