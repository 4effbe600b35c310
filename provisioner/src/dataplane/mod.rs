//! Netlink operations (veth, address, route, link, sysctl) and netns handles; setup, teardown and check of one sandbox.
