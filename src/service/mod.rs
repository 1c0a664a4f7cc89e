//! The operations on dead-letter topics, one implementation behind both
//! the `antidote dlt` commands (`cli::dlt`, which print) and the admin
//! console (`console`, which serialises):
//!
//! - [`browse`]: a page of a DLT's records from a position, never the
//!   whole topic;
//! - [`decode`]: a record's value decoded through its policy's schema;
//! - [`replay`]: what a replay would write back and skip (the dry run),
//!   and the replay itself, with its rate limit and fencing;
//! - [`breaker`]: an operator's close marker for a circuit breaker.
//!
//! Owns the filters the operations share, the connection to the
//! dead-letter cluster from a config, and small time and text helpers. It
//! reads DLTs through the runtime's [`crate::dlt::trust`] gate into the
//! core's [`DltRecord`] and never changes how the proxy writes DLT records:
//! the header names are the core's (`dlt_record`). It prints nothing: the
//! results are typed values.

pub mod breaker;
pub mod browse;
pub mod decode;
pub mod replay;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use crate::client::{ClientError, Cluster, Endpoint};
use crate::config::Config;
// The DLT record format is defined once, beside the code that writes it.
use crate::dlt::trust::{self, Reader};
pub use crate::dlt::{
    CONTEXT_HEADERS, H_ATTEMPT, H_CLASS, H_ERROR, H_FAILED_AT, H_OFFSET, H_PARTITION, H_POLICY,
    H_REPLAYED_FROM, H_RULE, H_TIMESTAMP, H_TOPIC,
};
use crate::dlt_marker::{is_marker, Attempt, Marker};
use crate::policy::PolicySet;
use crate::transport::tls;

pub use crate::replay::DltRecord;

/// Why a DLT operation failed.
#[derive(Debug, thiserror::Error)]
pub enum DltError {
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Policy(String),
    #[error("TLS: {0}")]
    Tls(#[from] tls::TlsError),
    #[error("{0}")]
    Client(#[from] ClientError),
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Produce(String),
    #[error("{0}")]
    Write(#[from] crate::dlt::write::WriteError),
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
}

pub use crate::dlt::trust::dlt_record;

/// Filters shared by `inspect`, `replay` and the console's browser.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Filters {
    /// Only records of this class (poison, stale, unknown).
    #[arg(long)]
    pub class: Option<String>,
    /// Only records whose original topic is this.
    #[arg(long)]
    pub origin_topic: Option<String>,
    /// Only records whose original partition is this.
    #[arg(long)]
    pub origin_partition: Option<i32>,
    /// Only records whose failing rule (x-error-rule) is this.
    #[arg(long)]
    pub rule: Option<String>,
    /// Only records dead-lettered at or after TIME (RFC 3339 such as
    /// 2026-01-31T12:00:00Z, epoch milliseconds, or an age such as 2h).
    #[arg(long, value_parser = parse_time_arg)]
    pub since: Option<i64>,
    /// Only records dead-lettered before TIME (same forms as --since).
    #[arg(long, value_parser = parse_time_arg)]
    pub until: Option<i64>,
    /// Only records whose reason (x-error) contains this text.
    #[arg(long)]
    pub reason: Option<String>,
    /// Only records whose key is exactly this (UTF-8).
    #[arg(long)]
    pub key: Option<String>,
}

impl Filters {
    pub fn matches(&self, r: &DltRecord) -> bool {
        if self
            .class
            .as_deref()
            .is_some_and(|c| !c.eq_ignore_ascii_case(&r.class))
        {
            return false;
        }
        if self
            .origin_topic
            .as_deref()
            .is_some_and(|t| r.origin_topic.as_deref() != Some(t))
        {
            return false;
        }
        if self
            .origin_partition
            .is_some_and(|p| r.origin_partition != Some(p))
        {
            return false;
        }
        if self.rule.as_deref().is_some_and(|x| x != r.rule) {
            return false;
        }
        let at = r.failed_at.unwrap_or(r.timestamp);
        if self.since.is_some_and(|s| at < s) || self.until.is_some_and(|u| at >= u) {
            return false;
        }
        if self
            .reason
            .as_deref()
            .is_some_and(|s| !r.reason.contains(s))
        {
            return false;
        }
        if self
            .key
            .as_deref()
            .is_some_and(|k| r.key.as_deref() != Some(k.as_bytes()))
        {
            return false;
        }
        true
    }
}

/// The config and policies an operation runs with: a `dlt` command's
/// from its config file, the console's the running proxy's (its current
/// policies, reloads included).
pub struct Context {
    pub config: Config,
    pub policies: Arc<PolicySet>,
}

impl Context {
    /// The running proxy's config and policies (the console).
    pub fn new(config: Config, policies: Arc<PolicySet>) -> Context {
        Context { config, policies }
    }

    pub fn load(path: &Path) -> Result<Context, DltError> {
        let config = Config::load(path).map_err(|e| DltError::Config(e.to_string()))?;
        // The `dlt` commands read and write with the fleet's keys.
        trust::set_keys(config.dead_letter.keys().map_err(DltError::Config)?);
        let policies = PolicySet::load(&config.policies).map_err(|errs| {
            DltError::Policy(
                errs.iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("\n"),
            )
        })?;
        Ok(Context {
            config,
            policies: Arc::new(policies),
        })
    }

    /// A client for the upstream cluster (the origin topics).
    pub fn upstream_cluster(&self) -> Result<Cluster, DltError> {
        let c = &self.config;
        Ok(Cluster::new(
            c.upstream.bootstrap_servers.clone(),
            Endpoint::upstream(c)?,
        ))
    }

    /// A client for the dead-letter cluster (`dead_letter.bootstrap_servers`,
    /// else upstream), with TLS chosen the way the proxy chooses it.
    pub fn dead_letter_cluster(&self) -> Result<Cluster, DltError> {
        let c = &self.config;
        let endpoint = Endpoint::dead_letter(c)?;
        let dlt = &c.dead_letter;
        let bootstrap = dlt
            .bootstrap_servers
            .clone()
            .unwrap_or_else(|| c.upstream.bootstrap_servers.clone());
        Ok(Cluster::new(bootstrap, endpoint))
    }

    /// Every existing DLT of the configured policies: topics named by
    /// rendering a policy's template for each existing policy topic and
    /// class, plus existing topics that match a template's glob. Internal
    /// topics (`__*`) are left out.
    pub async fn existing_dead_letter_topics(
        &self,
        cluster: &mut Cluster,
    ) -> Result<Vec<String>, DltError> {
        let meta = cluster.metadata(None).await?;
        let existing: BTreeSet<String> = meta
            .topics
            .iter()
            .filter(|t| t.error_code == 0)
            .filter_map(|t| t.name.as_ref().map(|n| n.to_string()))
            .filter(|n| !n.starts_with("__"))
            .collect();
        let mut out = BTreeSet::new();
        for topic in &existing {
            if self.policies.is_dead_letter_topic(topic) {
                out.insert(topic.clone());
            } else if let Some(p) = self.policies.for_topic(topic) {
                for class in crate::policy::Class::ALL {
                    let dlt = p.dead_letter_topic(topic, class);
                    if existing.contains(&dlt) && &dlt != topic {
                        out.insert(dlt);
                    }
                }
            }
        }
        Ok(out.into_iter().collect())
    }
}

/// The records of `topic` that `keep` selects, as [`DltRecord`]s, in
/// partition then offset order, each with its re-drive attempts. The whole
/// topic is read (to its high watermark); only the kept records (and the
/// attempt markers) are held in memory. Marker records are never returned.
pub async fn read_dlt(
    reader: Reader,
    cluster: &mut Cluster,
    topic: &str,
    mut keep: impl FnMut(&DltRecord) -> bool,
) -> Result<Vec<DltRecord>, DltError> {
    let mut out = Vec::new();
    let mut attempts: HashMap<String, Vec<Attempt>> = HashMap::new();
    crate::dlt::read_topic(cluster, topic, |p, r| {
        let Some(ctx) = trust::open(reader, topic, p, r) else {
            return;
        };
        if is_marker(&ctx) {
            if let Some(Marker::Attempt(a)) = Marker::parse(&ctx, r.key) {
                attempts.entry(a.of.clone()).or_default().push(a);
            }
            return;
        }
        let d = DltRecord::from_context(topic, p, r, &ctx, trust::keys());
        if keep(&d) {
            out.push(d);
        }
    })
    .await?;
    for d in &mut out {
        if let Some(a) = attempts.remove(&d.coordinate()) {
            d.redrive = a;
        }
    }
    Ok(out)
}

/// Parse `--since`/`--until`: RFC 3339 (`2026-01-31T12:00:00Z`,
/// `2026-01-31T12:00:00.5+01:00`, `2026-01-31`), epoch milliseconds (a bare
/// integer of 11+ digits), or an age such as `90s`, `15m`, `2h`, `7d`
/// (meaning that long before now). Returns epoch milliseconds.
pub fn parse_time_arg(s: &str) -> Result<i64, String> {
    parse_time(s, crate::clock::now_ms())
}

fn parse_time(s: &str, now_ms: i64) -> Result<i64, String> {
    let s = s.trim();
    if s.len() >= 11 && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().map_err(|_| format!("`{s}` is not a time"));
    }
    if let Some(ms) = parse_rfc3339(s) {
        return Ok(ms);
    }
    let age = s.strip_prefix('-').unwrap_or(s);
    match crate::config::parse_duration(age) {
        Ok(d) => Ok(now_ms - d.as_millis() as i64),
        Err(_) => Err(format!(
            "`{s}` is not a time: use RFC 3339 (2026-01-31T12:00:00Z), epoch milliseconds, or an age (15m, 2h, 7d)"
        )),
    }
}

/// RFC 3339 as `jiff` reads it (`T`, `t` or a space between date and time,
/// `Z` or a numeric offset, up to nanoseconds, a leap second read as :59),
/// or a bare full-date, meaning midnight UTC. Sub-millisecond digits are
/// truncated.
fn parse_rfc3339(s: &str) -> Option<i64> {
    if let Ok(ts) = s.parse::<jiff::Timestamp>() {
        return Some(ts.as_millisecond());
    }
    // `Date`'s parser would also take a datetime and drop its time.
    if s.len() != 10 {
        return None;
    }
    let date: jiff::civil::Date = s.parse().ok()?;
    let midnight = jiff::tz::Offset::UTC
        .to_timestamp(date.to_datetime(jiff::civil::Time::midnight()))
        .ok()?;
    Some(midnight.as_millisecond())
}

/// Epoch milliseconds as `2026-01-31T12:00:00.123Z`; outside jiff's range
/// (years -9999..=9999) the bare number, so a corrupt header still prints.
pub fn format_time(ms: i64) -> String {
    match jiff::Timestamp::from_millisecond(ms) {
        Ok(ts) => format!("{ts:.3}"),
        Err(_) => ms.to_string(),
    }
}

/// Bytes as text for humans: UTF-8 (control characters escaped, see
/// [`escape_controls`]), anything else as `0x…` hex.
pub fn show_bytes(b: Option<&[u8]>) -> String {
    match b {
        None => "null".into(),
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => escape_controls(s).into_owned(),
            Err(_) => format!(
                "0x{}",
                b.iter().map(|x| format!("{x:02x}")).collect::<String>()
            ),
        },
    }
}

/// `s` with every character that can drive a terminal written as `\u{..}`:
/// C0 and C1 controls, DEL, and the bidirectional overrides that reorder
/// what is shown. DLT contents come from any producer: printed raw, an ESC
/// sequence in a key or value could rewrite the operator's screen (or the
/// title, the clipboard, ...). The records themselves are untouched.
pub fn escape_controls(s: &str) -> std::borrow::Cow<'_, str> {
    let risky = |c: char| {
        c.is_control()
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !s.chars().any(risky) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if risky(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::record::Header;
    use crate::kafka::record::Record;

    #[test]
    fn times_parse_and_format() {
        let now = 1_800_000_000_000;
        assert_eq!(parse_time("1970-01-01T00:00:00Z", now).unwrap(), 0);
        assert_eq!(
            parse_time("2026-11-30T00:13:16Z", now).unwrap(),
            1_795_997_596_000
        );
        assert_eq!(
            parse_time("2026-11-30T01:13:16.5+01:00", now).unwrap(),
            1_795_997_596_500
        );
        assert_eq!(parse_time("2026-11-30", now).unwrap(), 1_795_996_800_000);
        assert_eq!(parse_time("1795997596000", now).unwrap(), 1_795_997_596_000);
        assert_eq!(parse_time("15m", now).unwrap(), now - 900_000);
        assert_eq!(parse_time("-2h", now).unwrap(), now - 7_200_000);
        assert!(parse_time("yesterday", now).is_err());
        assert!(parse_time("2026-13-01T00:00:00Z", now).is_err());
        assert_eq!(format_time(1_795_997_596_500), "2026-11-30T00:13:16.500Z");
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000Z");
        for ms in [-86_400_001, 951_782_400_000, 4_102_444_800_123] {
            assert_eq!(parse_time(&format_time(ms), now).unwrap(), ms);
        }
        assert_eq!(format_time(i64::MAX), i64::MAX.to_string());
    }

    /// What jiff adds, and what it refuses that the hand-written parser let
    /// through; errors still quote the value.
    #[test]
    fn rfc3339_forms_jiff_reads() {
        let now = 1_800_000_000_000;
        let want = 1_795_997_596_000;
        for s in [
            "2026-11-30t00:13:16z",
            "2026-11-30 00:13:16Z",
            "2026-11-30T00:13:16.000000000Z",
            "2026-11-30T00:13:16.0009Z",
            "2026-11-30T01:13:16+01:00",
            "2026-11-29T23:13:16-01:00",
        ] {
            assert_eq!(parse_time(s, now), Ok(want), "{s}");
        }
        // A leap second is read as :59 of the same minute.
        assert_eq!(
            parse_time("2016-12-31T23:59:60Z", now),
            Ok(1_483_228_799_000)
        );
        for bad in [
            "2026-02-30",
            "2026-02-30T00:00:00Z",
            "2026-11-30T24:00:01Z",
            "2026-11-30T00:13:16",
        ] {
            let e = parse_time(bad, now).unwrap_err();
            assert!(e.contains(&format!("`{bad}`")), "{e}");
        }
    }

    #[test]
    fn dlt_record_reads_context_headers() {
        let headers = [
            Header {
                key: b"idempotency-key",
                value: Some(b"k1"),
            },
            Header {
                key: b"x-original-topic",
                value: Some(b"geo"),
            },
            Header {
                key: b"x-original-partition",
                value: Some(b"2"),
            },
            Header {
                key: b"x-original-offset",
                value: Some(b"41"),
            },
            Header {
                key: b"x-error-class",
                value: Some(b"poison"),
            },
            Header {
                key: b"x-error",
                value: Some(b"/lat: 91 is outside [-90, 90]"),
            },
            Header {
                key: b"x-error-rule",
                value: Some(b"coordinates"),
            },
            Header {
                key: b"x-failed-at",
                value: Some(b"1795997596000"),
            },
            Header {
                key: b"x-attempt",
                value: Some(b"2"),
            },
        ];
        let r = Record {
            offset: 7,
            timestamp: 5,
            key: Some(b"dev-1"),
            value: Some(b"{}"),
            headers: headers.to_vec(),
        };
        let d = dlt_record(Reader::Inspect, "geo.dlt", 0, &r).expect("format 1");
        assert_eq!(d.origin(), "geo-2@41");
        assert_eq!(d.coordinate(), "geo.dlt/0/7");
        assert_eq!(
            (d.class.as_str(), d.rule.as_str(), d.attempt),
            ("poison", "coordinates", 2)
        );
        let mut f = Filters {
            class: Some("POISON".into()),
            reason: Some("outside".into()),
            ..Default::default()
        };
        assert!(f.matches(&d));
        f.origin_partition = Some(1);
        assert!(!f.matches(&d));
        let f = Filters {
            since: Some(1_795_997_596_001),
            ..Default::default()
        };
        assert!(!f.matches(&d));
        let f = Filters {
            key: Some("dev-1".into()),
            until: Some(1_795_997_596_001),
            ..Default::default()
        };
        assert!(f.matches(&d));
    }

    #[test]
    fn bytes_show_as_text_or_hex() {
        assert_eq!(show_bytes(Some(b"abc")), "abc");
        assert_eq!(show_bytes(Some(&[0xff, 0x00])), "0xff00");
        assert_eq!(show_bytes(None), "null");
    }

    #[test]
    fn terminal_control_characters_are_escaped() {
        assert_eq!(
            show_bytes(Some(b"a\x1b]0;pwned\x07b\x1b[2J")),
            "a\\u{1b}]0;pwned\\u{7}b\\u{1b}[2J"
        );
        assert_eq!(
            escape_controls("x\u{9b}31m\u{202e}y\u{7f}"),
            "x\\u{9b}31m\\u{202e}y\\u{7f}"
        );
        assert!(matches!(
            escape_controls("plain é"),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
