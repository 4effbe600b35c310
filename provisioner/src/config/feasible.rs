//! Whether an ADD on a network could succeed: the rules across the `ipam` ranges, its routes
//! and the MTU that the address allocator and the dataplane enforce one sandbox at a time.
//! A config that breaks one of them is invalid with its reason, instead of a ready daemon
//! whose every ADD fails after allocating.

use crate::ipam::{Family, IpamConfig, IpamError, RangeSets};

/// The smallest MTU an IPv6 link may have (RFC 8200).
pub const IPV6_MIN_MTU: u32 = 1280;

/// Why a network cannot serve an ADD: the field as written under `ipam` (or `mtu`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Infeasible {
    /// `ranges[1]`, `routes[0].dst`, `mtu`... (relative to the plugin object).
    pub field: String,
    pub reason: String,
}

impl Infeasible {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Parses the `ipam` object and checks every rule; the first broken one is returned.
pub fn check(ipam: &serde_json::Value, mtu: Option<u32>) -> Result<(), Infeasible> {
    let config: IpamConfig =
        serde_json::from_value(ipam.clone()).map_err(|e| Infeasible::new("ipam", e.to_string()))?;
    let sets = config.validate().map_err(|e| match e {
        IpamError::Config {
            field,
            value,
            reason,
        } => Infeasible::new(format!("ipam.{field}"), format!("{value:?}: {reason}")),
        other => Infeasible::new("ipam", other.to_string()),
    })?;
    // Range sets as written: `subnet` first when given, then `ranges[i]`.
    let names: Vec<String> = config
        .subnet
        .iter()
        .map(|_| "ipam.subnet".to_owned())
        .chain((0..config.ranges.len()).map(|i| format!("ipam.ranges[{i}]")))
        .collect();
    one_set_per_family(&sets, &names)?;
    mtu_fits(&sets, mtu)?;
    routes_have_a_range(&config, &sets)?;
    gateways_not_allocatable(&sets, &names)
}

/// A sandbox gets one address per range set, and one address per family.
fn one_set_per_family(sets: &RangeSets, names: &[String]) -> Result<(), Infeasible> {
    for (i, set) in sets.sets().iter().enumerate() {
        if let Some(first) = sets.sets()[..i]
            .iter()
            .position(|s| s.family() == set.family())
        {
            return Err(Infeasible::new(
                name(names, i),
                format!(
                    "a second {} range set ({} is one already): a sandbox gets one address per \
                     family; put both ranges in one set to use both",
                    set.family(),
                    name(names, first)
                ),
            ));
        }
    }
    Ok(())
}

fn mtu_fits(sets: &RangeSets, mtu: Option<u32>) -> Result<(), Infeasible> {
    let v6 = sets.sets().iter().any(|s| s.family() == Family::V6);
    match mtu {
        Some(mtu) if v6 && mtu < IPV6_MIN_MTU => Err(Infeasible::new(
            "mtu",
            format!(
                "{mtu} is below {IPV6_MIN_MTU}, the minimum of IPv6, and the network has an IPv6 range"
            ),
        )),
        _ => Ok(()),
    }
}

fn routes_have_a_range(config: &IpamConfig, sets: &RangeSets) -> Result<(), Infeasible> {
    for (i, route) in config.routes.iter().enumerate() {
        let family = if route.dst.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        };
        if !sets.sets().iter().any(|s| s.family() == family) {
            return Err(Infeasible::new(
                format!("ipam.routes[{i}].dst"),
                format!(
                    "{}: no {family} range, so no sandbox has an address to route it from",
                    route.dst
                ),
            ));
        }
        if let Some(gw) = route.gw
            && gw.is_ipv4() != route.dst.is_ipv4()
        {
            return Err(Infeasible::new(
                format!("ipam.routes[{i}].gw"),
                format!("{gw} is not of the family of {}", route.dst),
            ));
        }
    }
    Ok(())
}

/// The gateway of a range lives on the host end of every veth: no range may hand it out.
fn gateways_not_allocatable(sets: &RangeSets, names: &[String]) -> Result<(), Infeasible> {
    let all: Vec<(String, &crate::ipam::IpRange)> = sets
        .sets()
        .iter()
        .enumerate()
        .flat_map(|(i, s)| {
            s.ranges()
                .iter()
                .enumerate()
                .map(move |(j, r)| (format!("{}[{j}]", name(names, i)), r))
        })
        .collect();
    for (gw_field, with_gw) in &all {
        for (field, other) in &all {
            if field != gw_field && other.contains(with_gw.gateway()) {
                return Err(Infeasible::new(
                    format!("{gw_field}.gateway"),
                    format!(
                        "{} is inside {field} {other}, which would hand it out to a sandbox",
                        with_gw.gateway()
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn name(names: &[String], i: usize) -> String {
    names
        .get(i)
        .cloned()
        .unwrap_or_else(|| format!("range set {i}"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn field_of(ipam: &serde_json::Value, mtu: Option<u32>) -> Option<String> {
        check(ipam, mtu).err().map(|e| e.field)
    }

    #[test]
    fn dual_stack_with_routes_is_feasible() {
        let ipam = json!({
            "ranges": [[{ "subnet": "10.1.0.0/24" }], [{ "subnet": "fd00::/64" }]],
            "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]
        });
        assert_eq!(check(&ipam, Some(1500)), Ok(()));
        let single = json!({ "subnet": "10.1.0.0/24", "routes": [{ "dst": "0.0.0.0/0" }] });
        assert_eq!(check(&single, None), Ok(()));
        // Two ranges of one family in one set: one address from the set.
        let one_set =
            json!({ "ranges": [[{ "subnet": "10.1.0.0/24" }, { "subnet": "10.2.0.0/24" }]] });
        assert_eq!(check(&one_set, None), Ok(()));
    }

    #[test]
    fn two_range_sets_of_one_family_are_infeasible() {
        let ipam =
            json!({ "ranges": [[{ "subnet": "10.1.0.0/24" }], [{ "subnet": "10.2.0.0/24" }]] });
        let e = check(&ipam, None).expect_err("two v4 sets");
        assert_eq!(e.field, "ipam.ranges[1]");
        assert!(e.reason.contains("second IPv4 range set"), "{}", e.reason);
        let mixed = json!({ "subnet": "fd00::/64", "ranges": [[{ "subnet": "fd01::/64" }]] });
        assert_eq!(field_of(&mixed, None).as_deref(), Some("ipam.ranges[0]"));
    }

    #[test]
    fn ipv6_with_an_mtu_below_1280_is_infeasible() {
        let ipam = json!({ "ranges": [[{ "subnet": "fd00::/64" }]] });
        let e = check(&ipam, Some(1000)).expect_err("mtu 1000");
        assert_eq!(e.field, "mtu");
        assert!(e.reason.contains("1280"), "{}", e.reason);
        assert_eq!(check(&ipam, Some(1280)), Ok(()));
        // IPv4 alone may use a small MTU.
        assert_eq!(
            check(&json!({ "subnet": "10.1.0.0/24" }), Some(1000)),
            Ok(())
        );
    }

    #[test]
    fn a_route_of_a_family_without_a_range_is_infeasible() {
        let ipam = json!({ "subnet": "10.1.0.0/24", "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }] });
        let e = check(&ipam, None).expect_err("v6 route");
        assert_eq!(e.field, "ipam.routes[1].dst");
        assert!(e.reason.contains("no IPv6 range"), "{}", e.reason);
        let crossed = json!({ "subnet": "10.1.0.0/24", "routes": [{ "dst": "10.9.0.0/16", "gw": "fd00::1" }] });
        assert_eq!(
            field_of(&crossed, None).as_deref(),
            Some("ipam.routes[0].gw")
        );
    }

    #[test]
    fn a_gateway_inside_another_range_is_infeasible() {
        let ipam = json!({ "ranges": [[
            { "subnet": "10.1.0.0/24", "rangeStart": "10.1.0.10", "rangeEnd": "10.1.0.100", "gateway": "10.1.0.200" },
            { "subnet": "10.1.0.0/24", "rangeStart": "10.1.0.150", "rangeEnd": "10.1.0.250", "gateway": "10.1.0.1" }
        ]] });
        let e = check(&ipam, None).expect_err("gateway handed out");
        assert_eq!(e.field, "ipam.ranges[0][0].gateway");
        assert!(
            e.reason.contains("10.1.0.200 is inside ipam.ranges[0][1]"),
            "{}",
            e.reason
        );
    }

    #[test]
    fn an_invalid_subnet_names_its_field() {
        let ipam = json!({ "ranges": [[{ "subnet": "10.1.0.0/33" }]] });
        let e = check(&ipam, None).expect_err("bad subnet");
        assert!(e.field.starts_with("ipam.ranges[0][0]"), "{}", e.field);
        let e = check(&json!({ "subnet": 7 }), None).expect_err("wrong type");
        assert_eq!(e.field, "ipam");
    }
}
