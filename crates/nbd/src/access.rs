//! Who may connect: allow and deny lists with the nbdkit `ip` filter's rules, checked on
//! the peer's address (TCP) or credentials (Unix socket) before any byte is read. Pure.
//!
//! Rules (nbdkit-ip-filter(1)): a client that matches any entry of the allow list is let in;
//! otherwise one that matches any entry of the deny list is refused; otherwise it is let in.
//! Entries: `all`/`any`, `allipv4`/`anyipv4`, `allipv6`/`anyipv6`, `allunix`/`anyunix`,
//! an address or `ADDR/BITS` (IPv4 or IPv6; an IPv4-mapped IPv6 peer matches IPv4
//! entries), `uid:N`, `gid:N`, `pid:N` (Unix sockets only).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// The far end of a connection, as far as the rules see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    Ip(IpAddr),
    /// A Unix socket peer's credentials (SO_PEERCRED); None if they could not be read.
    Unix(Option<Cred>),
    /// A TCP peer whose address could not be read: matches only `all`.
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Ip(a) => write!(f, "{a}"),
            Peer::Unix(Some(c)) => write!(f, "unix pid {} uid {} gid {}", c.pid, c.uid, c.gid),
            Peer::Unix(None) => write!(f, "unix (credentials unknown)"),
            Peer::Unknown => write!(f, "an unknown address"),
        }
    }
}

/// One allow or deny entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    Any,
    AnyV4,
    AnyV6,
    AnyUnix,
    Net { addr: IpAddr, bits: u8 },
    Uid(u32),
    Gid(u32),
    Pid(i32),
}

impl FromStr for Rule {
    type Err = String;
    fn from_str(s: &str) -> Result<Rule, String> {
        Ok(match s {
            "all" | "any" => Rule::Any,
            "allipv4" | "anyipv4" => Rule::AnyV4,
            "allipv6" | "anyipv6" => Rule::AnyV6,
            "allunix" | "anyunix" => Rule::AnyUnix,
            _ => {
                let num = |v: &str| {
                    v.parse::<u32>()
                        .map_err(|_| format!("'{s}': expected a number after the colon"))
                };
                if let Some(v) = s.strip_prefix("uid:") {
                    return Ok(Rule::Uid(num(v)?));
                }
                if let Some(v) = s.strip_prefix("gid:") {
                    return Ok(Rule::Gid(num(v)?));
                }
                if let Some(v) = s.strip_prefix("pid:") {
                    let p = num(v)?;
                    return i32::try_from(p)
                        .map(Rule::Pid)
                        .map_err(|_| format!("'{s}': no such process id"));
                }
                let (a, bits) = match s.split_once('/') {
                    Some((a, b)) => (a, Some(b)),
                    None => (s, None),
                };
                let addr: IpAddr = a.parse().map_err(|_| {
                    format!(
                        "'{s}': expected all, anyipv4, anyipv6, anyunix, an address, \
                         ADDRESS/BITS, uid:N, gid:N or pid:N"
                    )
                })?;
                let max = if addr.is_ipv4() { 32 } else { 128 };
                let bits = match bits {
                    None => max,
                    Some(b) => match b.parse::<u8>() {
                        Ok(n) if n <= max => n,
                        _ => return Err(format!("'{s}': the prefix length must be 0 to {max}")),
                    },
                };
                // An IPv4-mapped IPv6 rule (::ffff:a.b.c.d/96 or longer) is the IPv4 rule it
                // carries, as a mapped peer is the IPv4 peer (`canonical`).
                match addr {
                    IpAddr::V6(v6) if bits >= 96 => match v6.to_ipv4_mapped() {
                        Some(v4) => Rule::Net {
                            addr: IpAddr::V4(v4),
                            bits: bits - 96,
                        },
                        None => Rule::Net { addr, bits },
                    },
                    _ => Rule::Net { addr, bits },
                }
            }
        })
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Any => write!(f, "all"),
            Rule::AnyV4 => write!(f, "anyipv4"),
            Rule::AnyV6 => write!(f, "anyipv6"),
            Rule::AnyUnix => write!(f, "anyunix"),
            Rule::Net { addr, bits } => write!(f, "{addr}/{bits}"),
            Rule::Uid(n) => write!(f, "uid:{n}"),
            Rule::Gid(n) => write!(f, "gid:{n}"),
            Rule::Pid(n) => write!(f, "pid:{n}"),
        }
    }
}

/// The first `bits` bits of `a` and `b` are equal (false if either is shorter).
fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    if bits as usize > 8 * a.len().min(b.len()) {
        return false;
    }
    let (whole, rest) = ((bits / 8) as usize, bits % 8);
    if a[..whole] != b[..whole] {
        return false;
    }
    rest == 0 || {
        let mask = 0xffu8 << (8 - rest);
        a[whole] & mask == b[whole] & mask
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 one it carries.
fn canonical(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
        v4 => v4,
    }
}

impl Rule {
    pub fn matches(&self, peer: &Peer) -> bool {
        match (self, peer) {
            (Rule::Any, _) => true,
            (Rule::AnyUnix, Peer::Unix(_)) => true,
            (Rule::AnyV4, Peer::Ip(a)) => canonical(*a).is_ipv4(),
            (Rule::AnyV6, Peer::Ip(a)) => canonical(*a).is_ipv6(),
            // Rules are canonical since parsing (mapped ones are IPv4 rules).
            (Rule::Net { addr, bits }, Peer::Ip(a)) => match (*addr, canonical(*a)) {
                (IpAddr::V4(r), IpAddr::V4(p)) => prefix_eq(&r.octets(), &p.octets(), *bits),
                (IpAddr::V6(r), IpAddr::V6(p)) => prefix_eq(&r.octets(), &p.octets(), *bits),
                _ => false,
            },
            (Rule::Uid(n), Peer::Unix(Some(c))) => c.uid == *n,
            (Rule::Gid(n), Peer::Unix(Some(c))) => c.gid == *n,
            (Rule::Pid(n), Peer::Unix(Some(c))) => c.pid == *n,
            _ => false,
        }
    }
}

/// The allow and deny lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    pub allow: Vec<Rule>,
    pub deny: Vec<Rule>,
}

impl Access {
    /// Parses comma-separated lists (each flag may be given more than once).
    pub fn parse(allow: &[String], deny: &[String]) -> Result<Access, String> {
        let list = |flag: &str, v: &[String]| -> Result<Vec<Rule>, String> {
            v.iter()
                .flat_map(|s| s.split(','))
                .filter(|s| !s.trim().is_empty())
                .map(|s| s.trim().parse().map_err(|e| format!("--{flag} {e}")))
                .collect()
        };
        Ok(Access {
            allow: list("allow", allow)?,
            deny: list("deny", deny)?,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// Whether `peer` may connect; when refused, the deny entry it matched.
    pub fn check(&self, peer: &Peer) -> Result<(), Rule> {
        if self.allow.iter().any(|r| r.matches(peer)) {
            return Ok(());
        }
        match self.deny.iter().find(|r| r.matches(peer)) {
            Some(r) => Err(*r),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(s: &str) -> Peer {
        Peer::Ip(s.parse().unwrap())
    }
    fn unix(uid: u32, gid: u32) -> Peer {
        Peer::Unix(Some(Cred { pid: 7, uid, gid }))
    }
    fn access(allow: &str, deny: &str) -> Access {
        Access::parse(&[allow.to_string()], &[deny.to_string()]).unwrap()
    }

    #[test]
    fn nbdkit_ip_filter_examples() {
        let a = access("127.0.0.1,::1", "all");
        assert!(a.check(&ip("127.0.0.1")).is_ok());
        assert!(a.check(&ip("::1")).is_ok());
        assert!(a.check(&ip("::ffff:127.0.0.1")).is_ok(), "v4-mapped");
        assert_eq!(a.check(&ip("10.1.2.3")), Err(Rule::Any));
        assert!(a.check(&unix(0, 0)).is_err());

        let a = access("", "8.0.0.0/8");
        assert!(a.check(&ip("9.0.0.1")).is_ok());
        assert!(a.check(&ip("8.255.0.1")).is_err());
        assert!(a.check(&unix(0, 0)).is_ok(), "not in the deny list");

        // A mapped IPv6 rule is its IPv4 rule (and never a panic on any peer).
        let a = access("::ffff:127.0.0.1,::ffff:10.0.0.0/104", "all");
        assert!(a.check(&ip("127.0.0.1")).is_ok());
        assert!(a.check(&ip("::ffff:127.0.0.1")).is_ok());
        assert!(a.check(&ip("10.200.0.1")).is_ok());
        assert!(a.check(&ip("11.0.0.1")).is_err());
        assert!(a.check(&ip("2001:db8::1")).is_err());
        assert!(a.check(&Peer::Unknown).is_err());
        assert!(access("", "anyunix").check(&Peer::Unknown).is_ok());

        let a = access("anyipv6", "all");
        assert!(a.check(&ip("2001:db8::1")).is_ok());
        assert!(a.check(&ip("192.0.2.1")).is_err());

        let a = access("uid:1000", "all");
        assert!(a.check(&unix(1000, 5)).is_ok());
        assert!(a.check(&unix(1001, 5)).is_err());
        assert!(a.check(&Peer::Unix(None)).is_err());
        assert!(a.check(&ip("127.0.0.1")).is_err());

        let a = access("gid:5", "anyunix");
        assert!(a.check(&unix(1, 5)).is_ok());
        assert!(a.check(&unix(1, 6)).is_err());
        assert!(a.check(&ip("127.0.0.1")).is_ok());

        // The allow list wins whatever the order on the command line.
        let a = access("10.0.0.0/8", "10.1.0.0/16");
        assert!(a.check(&ip("10.1.2.3")).is_ok());
        assert!(Access::default().check(&ip("1.2.3.4")).is_ok());
    }

    #[test]
    fn prefixes() {
        let r: Rule = "192.168.2.0/23".parse().unwrap();
        assert!(r.matches(&ip("192.168.3.9")));
        assert!(!r.matches(&ip("192.168.4.1")));
        let r: Rule = "2001:db8::/33".parse().unwrap();
        assert!(r.matches(&ip("2001:db8:7fff::1")));
        assert!(!r.matches(&ip("2001:db8:8000::1")));
        let r: Rule = "0.0.0.0/0".parse().unwrap();
        assert!(r.matches(&ip("203.0.113.7")));
        assert!(!r.matches(&ip("2001:db8::1")));
    }

    #[test]
    fn malformed_entries_are_refused_with_the_flag_and_entry() {
        for (allow, want) in [
            ("10.0.0.0/33", "the prefix length must be 0 to 32"),
            ("::/129", "0 to 128"),
            ("10.0.0.0/x", "prefix length"),
            ("uid:me", "expected a number"),
            ("pid:4294967295", "no such process id"),
            ("localhost", "expected all"),
            ("10.0.0", "expected all"),
        ] {
            let e = Access::parse(&[allow.to_string()], &[]).unwrap_err();
            assert!(e.starts_with("--allow '"), "{e}");
            assert!(e.contains(want), "{allow}: {e}");
        }
        let e = Access::parse(&[], &["all,bogus".into()]).unwrap_err();
        assert!(e.starts_with("--deny 'bogus'"), "{e}");
    }

    proptest! {
        #[test]
        fn displayed_rules_parse_back(s in "[0-9a-z:./]{0,24}") {
            if let Ok(r) = s.parse::<Rule>() {
                prop_assert_eq!(r.to_string().parse::<Rule>(), Ok(r));
            }
        }

        #[test]
        fn any_rule_against_any_peer_never_panics(
            r in "[0-9a-f:./]{1,40}", p in any::<[u8; 16]>(), v4 in any::<bool>(), bits in 0u8..=128
        ) {
            let peer = if v4 {
                Peer::Ip(IpAddr::V4([p[0], p[1], p[2], p[3]].into()))
            } else {
                Peer::Ip(IpAddr::V6(p.into()))
            };
            if let Ok(rule) = r.parse::<Rule>() {
                let _ = rule.matches(&peer);
            }
            let mapped = format!("::ffff:{}.{}.{}.{}/{}", p[0], p[1], p[2], p[3], bits);
            if let Ok(rule) = mapped.parse::<Rule>() {
                let _ = rule.matches(&peer);
            }
        }

        #[test]
        fn a_prefix_matches_exactly_the_addresses_it_covers(a in any::<u32>(), b in any::<u32>(), bits in 0u8..=32) {
            let r = Rule::Net { addr: IpAddr::V4(a.into()), bits };
            let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
            prop_assert_eq!(r.matches(&Peer::Ip(IpAddr::V4(b.into()))), a & mask == b & mask);
        }
    }
}
