//! Validated address ranges: one [`IpRange`] is a `rangeStart..=rangeEnd` slice of a subnet with
//! its gateway; a [`RangeSet`] is a list of ranges of one family from which one address is taken;
//! [`RangeSets`] is the whole validated config (e.g. one v4 set and one v6 set for dual-stack).
//!
//! Addresses are handled as `u128` so that v4 and v6 share one code path and a v6 /64 is never
//! materialised: the allocator asks for "the first allocatable address at or after x".

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;

use super::error::IpamError;

/// Address family of a range, range set or address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            Family::V4 => 4,
            Family::V6 => 6,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Family> {
        match code {
            4 => Some(Family::V4),
            6 => Some(Family::V6),
            _ => None,
        }
    }

    fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// An address as a number (v4 in the low 32 bits).
pub(crate) fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The inverse of [`to_u128`]; `None` if a v4 value does not fit in 32 bits.
pub(crate) fn from_u128(family: Family, value: u128) -> Option<IpAddr> {
    match family {
        Family::V4 => u32::try_from(value)
            .ok()
            .map(|v| IpAddr::V4(Ipv4Addr::from(v))),
        Family::V6 => Some(IpAddr::V6(Ipv6Addr::from(value))),
    }
}

/// One validated range: allocatable addresses are `start..=end` minus the gateway. Network and
/// (v4) broadcast addresses are never inside `start..=end`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpRange {
    subnet: IpNetwork,
    start: IpAddr,
    end: IpAddr,
    gateway: IpAddr,
}

impl IpRange {
    /// Validates one range. `field` is the config path used in errors (e.g. `ranges[0][1]`).
    /// The subnet is canonicalised to its network address (`10.244.1.5/24` -> `10.244.1.0/24`).
    pub fn new(
        field: &str,
        subnet: IpNetwork,
        start: Option<IpAddr>,
        end: Option<IpAddr>,
        gateway: Option<IpAddr>,
    ) -> Result<IpRange, IpamError> {
        let family = Family::of(subnet.ip());
        let prefix = subnet.prefix();
        let subnet = IpNetwork::new(subnet.network(), prefix).map_err(|e| {
            IpamError::config(format!("{field}.subnet"), subnet.to_string(), e.to_string())
        })?;
        if prefix + 2 > family.bits() {
            return Err(IpamError::config(
                format!("{field}.subnet"),
                subnet.to_string(),
                format!(
                    "network too small to allocate from (prefix must be at most /{})",
                    family.bits() - 2
                ),
            ));
        }
        let network = to_u128(subnet.network());
        let last = to_u128(subnet.broadcast());
        // First and last usable: never the network address, never the v4 broadcast.
        let first_usable = network + 1;
        let last_usable = match family {
            Family::V4 => last - 1,
            Family::V6 => last,
        };
        let usable = |name: &str, ip: IpAddr| -> Result<u128, IpamError> {
            if Family::of(ip) != family {
                return Err(IpamError::config(
                    format!("{field}.{name}"),
                    ip.to_string(),
                    format!("not the same address family as subnet {subnet}"),
                ));
            }
            let v = to_u128(ip);
            if !(first_usable..=last_usable).contains(&v) {
                let why = if !subnet.contains(ip) {
                    format!("not inside subnet {subnet}")
                } else {
                    format!("the network or broadcast address of subnet {subnet}")
                };
                return Err(IpamError::config(
                    format!("{field}.{name}"),
                    ip.to_string(),
                    why,
                ));
            }
            Ok(v)
        };
        let start_v = match start {
            Some(ip) => usable("rangeStart", ip)?,
            None => first_usable,
        };
        let end_v = match end {
            Some(ip) => usable("rangeEnd", ip)?,
            None => last_usable,
        };
        if start_v > end_v {
            return Err(IpamError::config(
                format!("{field}.rangeEnd"),
                end.map(|ip| ip.to_string()).unwrap_or_default(),
                format!("before rangeStart {}", ip_of(family, start_v)),
            ));
        }
        let gateway = match gateway {
            Some(ip) => {
                usable("gateway", ip)?;
                ip
            }
            None => ip_of(family, first_usable),
        };
        let range = IpRange {
            subnet,
            start: ip_of(family, start_v),
            end: ip_of(family, end_v),
            gateway,
        };
        if range.size() == 0 {
            return Err(IpamError::config(
                field.to_string(),
                range.to_string(),
                "range holds no allocatable address besides the gateway",
            ));
        }
        Ok(range)
    }

    pub fn subnet(&self) -> IpNetwork {
        self.subnet
    }
    pub fn start(&self) -> IpAddr {
        self.start
    }
    pub fn end(&self) -> IpAddr {
        self.end
    }
    pub fn gateway(&self) -> IpAddr {
        self.gateway
    }
    pub fn family(&self) -> Family {
        Family::of(self.start)
    }

    /// Whether `ip` may be handed out from this range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        Family::of(ip) == self.family()
            && ip != self.gateway
            && (to_u128(self.start)..=to_u128(self.end)).contains(&to_u128(ip))
    }

    /// Number of allocatable addresses (saturating at `u128::MAX`).
    pub fn size(&self) -> u128 {
        let (s, e) = self.bounds();
        let n = (e - s).saturating_add(1);
        if (s..=e).contains(&to_u128(self.gateway)) {
            n - 1
        } else {
            n
        }
    }

    /// Every allocatable address in order (lazy; fine for a /64).
    pub fn iter(&self) -> impl Iterator<Item = IpAddr> + '_ {
        let family = self.family();
        let mut next = self.next_at_or_after(to_u128(self.start));
        std::iter::from_fn(move || {
            let cur = next?;
            next = cur.checked_add(1).and_then(|n| self.next_at_or_after(n));
            from_u128(family, cur)
        })
    }

    pub(crate) fn bounds(&self) -> (u128, u128) {
        (to_u128(self.start), to_u128(self.end))
    }

    /// The first allocatable address value `>= from`, if any. O(1).
    pub(crate) fn next_at_or_after(&self, from: u128) -> Option<u128> {
        let (s, e) = self.bounds();
        let mut c = from.max(s);
        if c == to_u128(self.gateway) && Family::of(self.gateway) == self.family() {
            c = c.checked_add(1)?;
        }
        (c <= e).then_some(c)
    }

    fn overlaps(&self, other: &IpRange) -> bool {
        let (s1, e1) = self.bounds();
        let (s2, e2) = other.bounds();
        self.family() == other.family() && s1 <= e2 && s2 <= e1
    }
}

fn ip_of(family: Family, v: u128) -> IpAddr {
    // Only called with values derived from a subnet of `family`, which always fit.
    from_u128(family, v).unwrap_or(match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        Family::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    })
}

impl fmt::Display for IpRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-{} in {} (gateway {})",
            self.start, self.end, self.subnet, self.gateway
        )
    }
}

/// Ranges of one family; one address per allocation is taken from the first range with room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSet {
    ranges: Vec<IpRange>,
}

impl RangeSet {
    /// `field` is the config path of the set (e.g. `ranges[1]`) used in errors.
    pub fn new(field: &str, ranges: Vec<IpRange>) -> Result<RangeSet, IpamError> {
        let Some(first) = ranges.first() else {
            return Err(IpamError::config(
                field,
                "[]",
                "a range set needs at least one range",
            ));
        };
        let family = first.family();
        for (j, r) in ranges.iter().enumerate() {
            if r.family() != family {
                return Err(IpamError::config(
                    format!("{field}[{j}].subnet"),
                    r.subnet.to_string(),
                    format!("a range set holds one address family; {field}[0] is {family}"),
                ));
            }
        }
        Ok(RangeSet { ranges })
    }

    pub fn ranges(&self) -> &[IpRange] {
        &self.ranges
    }
    pub fn family(&self) -> Family {
        // `new` guarantees at least one range.
        self.ranges.first().map_or(Family::V4, IpRange::family)
    }

    /// Index of the range that may hand out `ip`.
    pub fn position(&self, ip: IpAddr) -> Option<usize> {
        self.ranges.iter().position(|r| r.contains(ip))
    }
}

impl fmt::Display for RangeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (j, r) in self.ranges.iter().enumerate() {
            if j > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{r}")?;
        }
        f.write_str("]")
    }
}

/// The validated range configuration of one network. No two ranges overlap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSets {
    sets: Vec<RangeSet>,
}

impl RangeSets {
    pub fn new(sets: Vec<RangeSet>) -> Result<RangeSets, IpamError> {
        if sets.is_empty() {
            return Err(IpamError::config(
                "ranges",
                "[]",
                "no subnet or ranges configured",
            ));
        }
        let all: Vec<(usize, usize, &IpRange)> = sets
            .iter()
            .enumerate()
            .flat_map(|(i, s)| s.ranges.iter().enumerate().map(move |(j, r)| (i, j, r)))
            .collect();
        for (a, &(i1, j1, r1)) in all.iter().enumerate() {
            for &(i2, j2, r2) in &all[a + 1..] {
                if r1.overlaps(r2) {
                    return Err(IpamError::config(
                        format!("ranges[{i2}][{j2}]"),
                        r2.to_string(),
                        format!("overlaps ranges[{i1}][{j1}] {r1}"),
                    ));
                }
            }
        }
        Ok(RangeSets { sets })
    }

    pub fn sets(&self) -> &[RangeSet] {
        &self.sets
    }

    /// `(set, range)` indices of the range that may hand out `ip`.
    pub fn position(&self, ip: IpAddr) -> Option<(usize, usize)> {
        self.sets
            .iter()
            .enumerate()
            .find_map(|(i, s)| s.position(ip).map(|j| (i, j)))
    }

    /// A stable description used to detect a changed range config in the store.
    pub(crate) fn fingerprint(&self) -> String {
        self.sets
            .iter()
            .map(RangeSet::to_string)
            .collect::<Vec<_>>()
            .join(";")
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a failing unwrap is a failing test")]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNetwork {
        s.parse().unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn v4_defaults_exclude_network_broadcast_gateway() {
        let r = IpRange::new("subnet", net("10.244.1.0/28"), None, None, None).unwrap();
        assert_eq!(r.start(), ip("10.244.1.1"));
        assert_eq!(r.end(), ip("10.244.1.14"));
        assert_eq!(r.gateway(), ip("10.244.1.1"));
        let all: Vec<IpAddr> = r.iter().collect();
        assert_eq!(all.len(), 13);
        assert_eq!(r.size(), 13);
        assert_eq!(all.first(), Some(&ip("10.244.1.2")));
        assert_eq!(all.last(), Some(&ip("10.244.1.14")));
        for bad in ["10.244.1.0", "10.244.1.1", "10.244.1.15", "10.244.2.2"] {
            assert!(!r.contains(ip(bad)), "{bad}");
            assert!(!all.contains(&ip(bad)), "{bad}");
        }
    }

    #[test]
    fn v6_defaults_include_last_address() {
        let r = IpRange::new("subnet", net("fd00::/120"), None, None, None).unwrap();
        assert_eq!(r.start(), ip("fd00::1"));
        assert_eq!(r.end(), ip("fd00::ff"));
        assert_eq!(r.size(), 254);
        assert_eq!(r.iter().next(), Some(ip("fd00::2")));
    }

    #[test]
    fn v6_slash_64_is_lazy() {
        let r = IpRange::new("subnet", net("fd00:1::/64"), None, None, None).unwrap();
        assert_eq!(r.size(), (1u128 << 64) - 2);
        let first: Vec<IpAddr> = r.iter().take(3).collect();
        assert_eq!(
            first,
            vec![ip("fd00:1::2"), ip("fd00:1::3"), ip("fd00:1::4")]
        );
    }

    #[test]
    fn gateway_in_the_middle_is_skipped() {
        let r = IpRange::new(
            "subnet",
            net("10.0.0.0/29"),
            Some(ip("10.0.0.2")),
            Some(ip("10.0.0.4")),
            Some(ip("10.0.0.3")),
        )
        .unwrap();
        let all: Vec<IpAddr> = r.iter().collect();
        assert_eq!(all, vec![ip("10.0.0.2"), ip("10.0.0.4")]);
        assert_eq!(r.size(), 2);
    }

    #[test]
    fn subnet_is_canonicalised() {
        let r = IpRange::new("subnet", net("10.244.1.77/24"), None, None, None).unwrap();
        assert_eq!(r.subnet(), net("10.244.1.0/24"));
    }

    #[test]
    fn errors_name_field_and_value() {
        let e = IpRange::new(
            "ranges[0][0]",
            net("10.0.0.0/24"),
            Some(ip("10.0.1.5")),
            None,
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("ranges[0][0].rangeStart") && e.contains("10.0.1.5"),
            "{e}"
        );
        let e = IpRange::new(
            "subnet",
            net("10.0.0.0/24"),
            None,
            Some(ip("10.0.0.255")),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("subnet.rangeEnd") && e.contains("broadcast"),
            "{e}"
        );
        let e = IpRange::new("subnet", net("10.0.0.0/31"), None, None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("too small"), "{e}");
        let e = IpRange::new(
            "subnet",
            net("10.0.0.0/24"),
            None,
            None,
            Some(ip("fd00::1")),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("gateway") && e.contains("family"), "{e}");
    }

    #[test]
    fn family_codes_of_the_store_decode_both_families() {
        // The store keys addresses by (family code, value): a restarted daemon must read back
        // its v4 and its v6 allocations.
        for (family, addr) in [(Family::V4, ip("10.0.0.7")), (Family::V6, ip("fd00::7"))] {
            assert_eq!(Family::from_code(family.code()), Some(family));
            assert_eq!(from_u128(family, to_u128(addr)), Some(addr));
        }
        assert_eq!(Family::from_code(5), None);
    }

    #[test]
    fn fingerprint_spells_out_every_range_in_order() {
        // The store compares it with the one it was written with: a changed range config must
        // give another fingerprint, and the same config the same one.
        let a = IpRange::new("r", net("10.0.0.0/28"), None, None, None).unwrap();
        let b = IpRange::new(
            "r",
            net("10.0.1.0/28"),
            Some(ip("10.0.1.5")),
            Some(ip("10.0.1.9")),
            None,
        )
        .unwrap();
        let v6 = IpRange::new("r", net("fd00::/120"), None, None, None).unwrap();
        let sets = |v4: Vec<IpRange>| {
            RangeSets::new(vec![
                RangeSet::new("ranges[0]", v4).unwrap(),
                RangeSet::new("ranges[1]", vec![v6.clone()]).unwrap(),
            ])
            .unwrap()
        };
        assert_eq!(
            sets(vec![a.clone(), b]).fingerprint(),
            "[10.0.0.1-10.0.0.14 in 10.0.0.0/28 (gateway 10.0.0.1), \
             10.0.1.5-10.0.1.9 in 10.0.1.0/28 (gateway 10.0.1.1)];\
             [fd00::1-fd00::ff in fd00::/120 (gateway fd00::1)]"
        );
        assert_eq!(
            sets(vec![a]).fingerprint(),
            "[10.0.0.1-10.0.0.14 in 10.0.0.0/28 (gateway 10.0.0.1)];\
             [fd00::1-fd00::ff in fd00::/120 (gateway fd00::1)]"
        );
    }

    #[test]
    fn overlap_and_mixed_family_rejected() {
        let a = IpRange::new("r", net("10.0.0.0/24"), None, None, None).unwrap();
        let b = IpRange::new("r", net("10.0.0.0/25"), None, None, None).unwrap();
        let v6 = IpRange::new("r", net("fd00::/64"), None, None, None).unwrap();
        let e = RangeSet::new("ranges[0]", vec![a.clone(), v6.clone()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("ranges[0][1].subnet"), "{e}");
        let sets = vec![
            RangeSet::new("ranges[0]", vec![a]).unwrap(),
            RangeSet::new("ranges[1]", vec![b]).unwrap(),
        ];
        let e = RangeSets::new(sets).unwrap_err().to_string();
        assert!(
            e.contains("ranges[1][0]") && e.contains("overlaps ranges[0][0]"),
            "{e}"
        );
    }
}
