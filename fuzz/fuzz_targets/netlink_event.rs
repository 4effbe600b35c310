//! The tracer's decoder: one ring-buffer record as the eBPF programs submit it (any user on the
//! node can make the kernel copy 256 bytes of their rtnetlink traffic into one), and the
//! rtnetlink parser on its own over buffers of any length.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use provisioner::trace::netlink_parse::{parse_replies, parse_requests};
use provisioner::trace::{Clock, decode};

fuzz_target!(|data: &[u8]| {
    static CLOCK: OnceLock<Clock> = OnceLock::new();
    let clock = CLOCK.get_or_init(Clock::new);
    if let Ok(event) = decode(data, clock) {
        let _ = event.kind.netns_cookies();
        serde_json::to_string(&event).expect("an event serialises");
    }
    let _ = parse_requests(data);
    let _ = parse_replies(data);
});
