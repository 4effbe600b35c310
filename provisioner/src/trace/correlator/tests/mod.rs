//! Correlator unit tests over synthetic events (no root, no kernel), a file per part of what
//! the correlator judges; `fixtures` holds what they share.

mod fixtures;

mod bounds;
mod intents;
mod pod_naming;
mod pod_resolver;
mod rejections;
mod revisions;
mod sandbox_recognition;
mod setup_verdicts;
mod state_reads;
mod timeline;
