//! Devices: a device's root qdisc is created when it first comes up and destroyed when the
//! device or its namespace goes (the namespace's end shows as its devices' going while its
//! reference count is 0).

use aya_ebpf::macros::btf_tracepoint;
use aya_ebpf::programs::BtfTracePointContext;
use provisioner_common::{DevEvent, TC_H_ROOT, kind};

use crate::kernel::{load, read_field};
use crate::netns_id::{net_id, or_unknown};
use crate::offsets::{
    OFF_DEV_FLAGS, OFF_DEV_IFINDEX, OFF_DEV_NAME, OFF_DEV_NET, OFF_NET_NS_REF,
    OFF_NETDEV_QUEUE_DEV, OFF_QDISC_DEV_QUEUE, OFF_QDISC_OPS, OFF_QDISC_OPS_ID, OFF_QDISC_PARENT,
};
use crate::ring::{EVENTS, count_lost, fill_header, wakeup_flags};

/// Sends a record of `kind` about `dev` (BTF-typed) and its qdisc's `ops` (any pointer).
#[inline(always)]
fn emit_dev(kind: u32, dev: *const u8, ops: *const u8) {
    let Some(mut entry) = EVENTS.reserve::<DevEvent>(0) else {
        count_lost(kind);
        return;
    };
    let record = entry.as_mut_ptr();
    // SAFETY: reserved slot; kernel memory is read with BTF-checked loads or probe helpers.
    unsafe {
        fill_header(&mut (*record).header, kind);
        let net: *const u8 = load(dev, OFF_DEV_NET.load());
        (*record).netns = or_unknown(net_id(net));
        let refs: u32 = read_field(net, OFF_NET_NS_REF.load()).unwrap_or(1);
        (*record).netns_dying = u32::from(refs == 0);
        (*record).ifindex = read_field(dev, OFF_DEV_IFINDEX.load()).unwrap_or(0);
        (*record).dev_flags = read_field(dev, OFF_DEV_FLAGS.load()).unwrap_or(0);
        (*record)._pad = 0;
        (*record).ifname = read_field(dev, OFF_DEV_NAME.load()).unwrap_or([0; 16]);
        (*record).qdisc = read_field(ops, OFF_QDISC_OPS_ID.load()).unwrap_or([0; 16]);
    }
    entry.submit(wakeup_flags());
}

/// `qdisc_create(const struct Qdisc_ops *ops, struct net_device *dev, u32 parent)`
#[btf_tracepoint(function = "qdisc_create")]
pub fn qdisc_create(ctx: BtfTracePointContext) -> i32 {
    let parent: u32 = ctx.arg(2);
    if parent == TC_H_ROOT {
        emit_dev(kind::DEV_UP, ctx.arg(1), ctx.arg(0));
    }
    0
}

/// `qdisc_destroy(struct Qdisc *q)`
#[btf_tracepoint(function = "qdisc_destroy")]
pub fn qdisc_destroy(ctx: BtfTracePointContext) -> i32 {
    let q: *const u8 = ctx.arg(0);
    // SAFETY: kernel memory is read with BTF-checked loads or probe helpers.
    unsafe {
        let Some(parent) = read_field::<u32>(q, OFF_QDISC_PARENT.load()) else {
            return 0;
        };
        if parent != TC_H_ROOT {
            return 0;
        }
        let queue: *const u8 = load(q, OFF_QDISC_DEV_QUEUE.load());
        if queue.is_null() {
            return 0;
        }
        let dev: *const u8 = load(queue, OFF_NETDEV_QUEUE_DEV.load());
        if dev.is_null() {
            return 0;
        }
        let ops: *const u8 = read_field(q, OFF_QDISC_OPS.load()).unwrap_or(core::ptr::null());
        emit_dev(kind::DEV_GONE, dev, ops);
    }
    0
}
