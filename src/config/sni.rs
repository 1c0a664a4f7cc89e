//! `listen.sni`: routing by TLS server name. One pattern names every
//! broker (`broker-{node}.kafka.example.com`); parsing it here means a
//! malformed one is reported at its own file:line:column, and the same
//! type both writes the advertised names and reads them back from a
//! ClientHello, so the two can never disagree.

use std::str::FromStr;

use serde::de::{self, Deserializer};
use serde::Deserialize;

/// `listen.sni`: the TLS server names clients use for the bootstrap and
/// for each broker, all on the bootstrap port.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sni {
    /// The name that reaches the bootstrap servers.
    #[serde(deserialize_with = "de_dns_name")]
    pub bootstrap: String,
    /// The name of broker N: a pattern with `{node}`.
    pub broker: SniPattern,
}

/// A host name pattern with one `{node}` placeholder, e.g.
/// `broker-{node}.kafka.example.com`. Names are lowercase (DNS names are
/// case-insensitive; a ClientHello's name is compared lowercased).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SniPattern {
    prefix: String,
    suffix: String,
}

impl SniPattern {
    /// The name advertised for broker `node`.
    pub fn name(&self, node: i32) -> String {
        format!("{}{node}{}", self.prefix, self.suffix)
    }

    /// The node id a server name stands for. Only the form `name` writes
    /// matches (no sign, no leading zeros), so each node has one name.
    pub fn node(&self, name: &str) -> Option<i32> {
        let name = name.to_ascii_lowercase();
        let digits = name
            .strip_prefix(&self.prefix)?
            .strip_suffix(&self.suffix)?;
        let canonical = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        if !canonical {
            return None;
        }
        digits.parse().ok()
    }
}

impl FromStr for SniPattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.to_ascii_lowercase();
        let Some((prefix, suffix)) = s.split_once("{node}") else {
            return Err(format!("`{s}` has no `{{node}}` placeholder"));
        };
        if suffix.contains("{node}") {
            return Err(format!("`{s}` has more than one `{{node}}`"));
        }
        check_dns_name(&format!("{prefix}0{suffix}"))
            .map_err(|e| format!("`{s}` does not make host names: {e}"))?;
        Ok(SniPattern {
            prefix: prefix.to_string(),
            suffix: suffix.to_string(),
        })
    }
}

impl<'de> Deserialize<'de> for SniPattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(CheckedStr(str::parse))
    }
}

/// Parses a string inside the deserializer's own call, so that serde_yaml
/// reports an error at the value's line and column (an error raised after
/// `String::deserialize` returns gets the enclosing mapping's position).
struct CheckedStr<T>(fn(&str) -> Result<T, String>);

impl<T> de::Visitor<'_> for CheckedStr<T> {
    type Value = T;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a host name")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        (self.0)(v).map_err(E::custom)
    }
}

/// A DNS host name a TLS client can send (no IP address, no wildcard).
fn check_dns_name(name: &str) -> Result<(), String> {
    let valid = rustls::pki_types::DnsName::try_from(name).is_ok()
        && !name.contains('*')
        && name.parse::<std::net::IpAddr>().is_err();
    if valid {
        Ok(())
    } else {
        Err(format!("`{name}` is not a DNS host name"))
    }
}

fn de_dns_name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    d.deserialize_str(CheckedStr(|s| {
        let name = s.to_ascii_lowercase();
        check_dns_name(&name).map(|()| name)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(s: &str) -> SniPattern {
        s.parse().unwrap()
    }

    #[test]
    fn a_pattern_names_a_node_and_reads_the_name_back() {
        let p = pattern("Broker-{node}.Kafka.test");
        assert_eq!(p.name(111), "broker-111.kafka.test");
        assert_eq!(p.node("broker-111.kafka.test"), Some(111));
        assert_eq!(p.node("BROKER-0.KAFKA.TEST"), Some(0));
        for other in [
            "broker-.kafka.test",
            "broker-007.kafka.test",
            "broker--1.kafka.test",
            "broker-1x.kafka.test",
            "broker-1.kafka.test.evil",
            "broker-99999999999.kafka.test",
            "bootstrap.kafka.test",
        ] {
            assert_eq!(p.node(other), None, "{other}");
        }
    }

    #[test]
    fn a_pattern_without_exactly_one_node_or_not_a_host_name_is_refused() {
        for (bad, why) in [
            ("broker.kafka.test", "no `{node}`"),
            ("b-{node}-{node}.kafka.test", "more than one"),
            ("*.{node}.kafka.test", "not a DNS host name"),
            ("b_{node} x", "not a DNS host name"),
        ] {
            let err = bad.parse::<SniPattern>().unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
