//! Records shared by the eBPF programs and userspace.
#![no_std]
