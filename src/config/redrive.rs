//! `dead_letter.redrive`: which classes of dead-lettered records the proxy
//! re-validates by itself, and after which delays. Checked while
//! deserializing, so a bad class or delay is reported at its own
//! `file:line:column`.

use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use crate::policy::Class;

/// At most this many delays: each is one attempt, and a record's attempt
/// markers stay in its DLT.
pub const MAX_DELAYS: usize = 10;

/// `dead_letter.redrive`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Redrive {
    /// Classes re-driven (not `blocked`: a blocked key is released by
    /// replaying or discarding its records).
    #[serde(deserialize_with = "de_classes")]
    pub classes: Vec<Class>,
    /// One attempt after each delay, counted from when the record was
    /// diverted; after the last one the record stays in its DLT.
    #[serde(deserialize_with = "de_delays")]
    pub delays: Vec<Duration>,
}

fn de_classes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Class>, D::Error> {
    let names = Vec::<OneClass>::deserialize(d)?;
    if names.is_empty() {
        return Err(de::Error::custom("name at least one class"));
    }
    let mut out = Vec::new();
    for OneClass(c) in names {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    Ok(out)
}

/// One class name, checked as it is read so that a bad one is reported at
/// the `classes` list's line and column (not the `redrive` block's).
struct OneClass(Class);

impl<'de> Deserialize<'de> for OneClass {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = String::deserialize(d)?;
        Class::ALL
            .into_iter()
            .filter(|c| *c != Class::Blocked)
            .find(|c| c.as_str() == n)
            .map(OneClass)
            .ok_or_else(|| {
                de::Error::custom(format!(
                    "unknown class `{n}` (one of: poison, stale, unknown and the other verdict classes; not blocked)"
                ))
            })
    }
}

fn de_delays<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Duration>, D::Error> {
    #[derive(Deserialize)]
    struct One(#[serde(deserialize_with = "super::de_duration")] Duration);
    let delays = Vec::<One>::deserialize(d)?;
    if delays.is_empty() || delays.len() > MAX_DELAYS {
        return Err(de::Error::custom(format!("give 1 to {MAX_DELAYS} delays")));
    }
    let delays: Vec<Duration> = delays.into_iter().map(|o| o.0).collect();
    if delays.iter().any(Duration::is_zero) || delays.windows(2).any(|w| w[1] <= w[0]) {
        return Err(de::Error::custom(
            "delays must be longer than 0s and increasing (each counts from the diversion)",
        ));
    }
    Ok(delays)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    const MINIMAL: &str = "listen:\n  bootstrap: 127.0.0.1:29092\n  broker_port_base: 29100\nupstream:\n  bootstrap_servers: [127.0.0.1:9092]\n";

    fn parse(redrive: &str) -> Result<Config, String> {
        let text = format!("{MINIMAL}dead_letter:\n  redrive:\n{redrive}");
        Config::parse(&text, Path::new("cfg.yaml")).map_err(|e| e.0)
    }

    #[test]
    fn redrive_parses_classes_and_delays() {
        let c = parse("    classes: [unknown]\n    delays: [1m, 10m, 1h]\n").unwrap();
        let r = c.dead_letter.redrive.unwrap();
        assert_eq!(r.classes, [Class::Unknown]);
        assert_eq!(
            r.delays,
            [
                Duration::from_secs(60),
                Duration::from_secs(600),
                Duration::from_secs(3600)
            ]
        );
        assert!(Config::parse(MINIMAL, Path::new("c.yaml"))
            .unwrap()
            .dead_letter
            .redrive
            .is_none());
    }

    #[test]
    fn bad_redrive_values_name_their_position() {
        let e = parse("    classes: [unknown, blocked]\n    delays: [1m]\n").unwrap_err();
        assert!(
            e.starts_with("cfg.yaml:8:14: dead_letter.redrive.classes")
                && e.contains("unknown class `blocked`"),
            "{e}"
        );
        let e = parse("    classes: [unknown]\n    delays: [10m, 1m]\n").unwrap_err();
        assert!(
            e.starts_with("cfg.yaml:8:5: dead_letter.redrive") && e.contains("increasing"),
            "{e}"
        );
        let e = parse("    classes: [unknown]\n    delays: [1x]\n").unwrap_err();
        assert!(
            e.starts_with("cfg.yaml:9:13: dead_letter.redrive.delays"),
            "{e}"
        );
        let e = parse("    classes: [unknown]\n").unwrap_err();
        assert!(e.contains("delays"), "{e}");
        let e = parse("    classes: [unknown]\n    delays: [1m]\n    every: 2\n").unwrap_err();
        assert!(e.contains("unknown field `every`"), "{e}");
    }
}
