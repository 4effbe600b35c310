//! Allocator over ranges, durable store, reconciliation against the kernel.
