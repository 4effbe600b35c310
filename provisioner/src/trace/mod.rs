//! eBPF loading (aya), event decoding, correlation, verdicts, the `trace` session.
