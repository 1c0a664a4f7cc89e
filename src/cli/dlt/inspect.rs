//! `antidote dlt inspect`: what is in a dead-letter topic, for humans
//! (an aligned table, or a summary by class, rule, reason and origin
//! partition) and for scripts (`--json`, one object per line).
//!
//! Read-only: it fetches the DLT from its start to its high watermark and
//! never writes or commits anything.

use crate::dlt::trust::Reader;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use comfy_table::{ContentArrangement, Table};
use serde_json::{json, Value};

use super::{
    escape_controls as esc, format_time, read_dlt, show_bytes, Context, DltError, DltRecord,
    Filters,
};

/// Arguments of `antidote dlt inspect`.
#[derive(Debug, Clone, clap::Args)]
pub struct InspectArgs {
    /// The proxy's config file (the dead-letter cluster and the policies).
    #[arg(long, short)]
    pub config: PathBuf,
    /// The dead-letter topic; default: every existing DLT of the configured policies.
    #[arg(long)]
    pub topic: Option<String>,
    /// Counts by class, rule, reason and origin partition instead of records.
    #[arg(long)]
    pub summary: bool,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
    /// Decode each value through its policy's schema (file or registry)
    /// and show it as JSON (`decoded`); implies --json.
    #[arg(long)]
    pub decode: bool,
    /// Show at most N records (after filtering).
    #[arg(long)]
    pub limit: Option<usize>,
    #[command(flatten)]
    pub filters: Filters,
}

/// Run `dlt inspect`, writing to `out`.
pub async fn run(args: &InspectArgs, out: &mut dyn Write) -> Result<(), DltError> {
    let ctx = Context::load(&args.config)?;
    let mut cluster = ctx.dead_letter_cluster()?;
    let topics = match &args.topic {
        Some(t) => {
            if cluster.partitions(t).await?.is_none() {
                return Err(DltError::Usage(format!("topic {t} does not exist")));
            }
            vec![t.clone()]
        }
        None => {
            let ts = ctx.existing_dead_letter_topics(&mut cluster).await?;
            if ts.is_empty() {
                eprintln!("no dead-letter topic of the configured policies exists");
            }
            ts
        }
    };
    let mut records = Vec::new();
    for t in &topics {
        records.extend(
            read_dlt(Reader::Inspect, &mut cluster, t, |r| {
                args.filters.matches(r)
            })
            .await?,
        );
    }
    if let Some(n) = args.limit {
        records.truncate(n);
    }
    if args.summary {
        let mut s = Summary::of(&records);
        for t in &topics {
            crate::dlt::read_topic(&mut cluster, t, |p, r| {
                let Some(c) = crate::dlt::trust::open(Reader::Inspect, t, p, r) else {
                    return;
                };
                if let Some(crate::dlt_marker::Marker::Breaker(m)) =
                    crate::dlt_marker::Marker::parse(&c, r.key)
                {
                    let what = match (m.open, m.divert) {
                        (true, _) => "tripped (held)",
                        (false, false) => "closed (judged again)",
                        (false, true) => "closed (diversions accepted through)",
                    };
                    s.breaker.push((
                        format!("{}-{}", esc(&m.topic), m.partition),
                        what,
                        m.through,
                    ));
                }
            })
            .await?;
        }
        if args.json {
            writeln!(out, "{}", s.to_json())?;
        } else {
            s.write_table(out)?;
        }
    } else if args.decode {
        let registry = crate::service::decode::registry(&ctx)?;
        for r in &records {
            let mut j = record_json(r);
            j["decoded"] = crate::service::decode::decoded(&ctx, registry.as_ref(), r).await;
            writeln!(out, "{j}")?;
        }
    } else if args.json {
        for r in &records {
            writeln!(out, "{}", record_json(r))?;
        }
    } else {
        write_table(out, &records)?;
    }
    out.flush()?;
    Ok(())
}

pub use crate::service::browse::record_json;

const COLUMNS: [&str; 10] = [
    "DLT",
    "PART",
    "OFFSET",
    "ORIGIN",
    "CLASS",
    "RULE",
    "POLICY",
    "FAILED AT",
    "KEY",
    "REASON",
];

/// Cells longer than this are cut (the reason, the last column, is not).
const MAX_CELL: usize = 40;

fn cut(s: &str, max: usize) -> String {
    let s = esc(&s.replace(['\n', '\r', '\t'], " ")).into_owned();
    if s.chars().count() <= max {
        s
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// The records as an aligned table. When a record names a failed
/// data-contract rule in its (antidote's own) context, a `CONTRACT RULE`
/// column shows its name, mode and subject (`__rule.name`, `__rule.mode`,
/// `__rule.subject`; the exception is the reason, the topic the origin's).
pub fn write_table(out: &mut dyn Write, records: &[DltRecord]) -> std::io::Result<()> {
    let contracts = records.iter().any(|r| r.contract_rule.is_some());
    let mut head = COLUMNS.to_vec();
    if contracts {
        head.insert(COLUMNS.len() - 1, "CONTRACT RULE");
    }
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            let mut row = vec![
                cut(&r.dlt_topic, MAX_CELL),
                r.dlt_partition.to_string(),
                r.dlt_offset.to_string(),
                cut(&r.origin(), MAX_CELL),
                cut(&r.class, MAX_CELL),
                cut(&r.rule, MAX_CELL),
                cut(&r.policy, MAX_CELL),
                r.failed_at.map(format_time).unwrap_or_else(|| "-".into()),
                r.key
                    .as_deref()
                    .map(|k| cut(&show_bytes(Some(k)), 24))
                    .unwrap_or_else(|| "-".into()),
            ];
            if contracts {
                row.push(r.contract_rule.as_ref().map_or_else(
                    || "-".into(),
                    |c| {
                        cut(
                            &format!("{} {} {}", c.name, c.mode, c.subject),
                            2 * MAX_CELL,
                        )
                    },
                ));
            }
            row.push(cut(&r.reason, 200));
            row
        })
        .collect();
    write_aligned(out, &head, &rows)?;
    writeln!(
        out,
        "({} record{})",
        records.len(),
        if records.len() == 1 { "" } else { "s" }
    )
}

/// `rows` under `head` as a borderless table, columns two spaces apart,
/// lines without trailing blanks. No wrapping: a cell is cut by [`cut`]
/// before it gets here, and a pipe has no width to wrap at.
fn write_aligned<R: AsRef<[String]>>(
    out: &mut dyn Write,
    head: &[&str],
    rows: &[R],
) -> std::io::Result<()> {
    let mut table = Table::new();
    table
        .load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(head.to_vec())
        .add_rows(rows.iter().map(|r| r.as_ref().to_vec()));
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    for line in table.lines() {
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// Counts by class, rule, reason and origin partition.
#[derive(Debug, Default)]
pub struct Summary {
    pub total: u64,
    pub by_class: BTreeMap<String, u64>,
    pub by_rule: BTreeMap<String, u64>,
    pub by_reason: BTreeMap<String, u64>,
    /// `topic-partition` of the original records.
    pub by_origin_partition: BTreeMap<String, u64>,
    pub by_dlt: BTreeMap<String, u64>,
    pub first_failed_at: Option<i64>,
    pub last_failed_at: Option<i64>,
    /// The diversion circuit breaker's markers in these DLTs, in order:
    /// `topic-partition`, what happened, at which origin offset.
    pub breaker: Vec<(String, &'static str, i64)>,
}

impl Summary {
    pub fn of(records: &[DltRecord]) -> Summary {
        let mut s = Summary::default();
        for r in records {
            s.total += 1;
            *s.by_class.entry(esc(&r.class).into_owned()).or_default() += 1;
            *s.by_rule.entry(esc(&r.rule).into_owned()).or_default() += 1;
            *s.by_reason.entry(esc(&r.reason).into_owned()).or_default() += 1;
            let origin = match (&r.origin_topic, r.origin_partition) {
                (Some(t), Some(p)) => format!("{}-{p}", esc(t)),
                _ => "-".into(),
            };
            *s.by_origin_partition.entry(origin).or_default() += 1;
            *s.by_dlt.entry(esc(&r.dlt_topic).into_owned()).or_default() += 1;
            if let Some(at) = r.failed_at {
                s.first_failed_at = Some(s.first_failed_at.map_or(at, |f| f.min(at)));
                s.last_failed_at = Some(s.last_failed_at.map_or(at, |l| l.max(at)));
            }
        }
        s
    }

    pub fn to_json(&self) -> Value {
        json!({
            "total": self.total,
            "by_class": self.by_class,
            "by_rule": self.by_rule,
            "by_reason": self.by_reason,
            "by_origin_partition": self.by_origin_partition,
            "by_dlt": self.by_dlt,
            "first_failed_at": self.first_failed_at.map(format_time),
            "last_failed_at": self.last_failed_at.map(format_time),
            "breaker": self.breaker.iter().map(|(tp, what, at)| {
                json!({"origin_partition": tp, "event": what, "offset": at})
            }).collect::<Vec<_>>(),
        })
    }

    pub fn write_table(&self, out: &mut dyn Write) -> std::io::Result<()> {
        writeln!(
            out,
            "{} record{}",
            self.total,
            if self.total == 1 { "" } else { "s" }
        )?;
        if let (Some(f), Some(l)) = (self.first_failed_at, self.last_failed_at) {
            writeln!(
                out,
                "dead-lettered between {} and {}",
                format_time(f),
                format_time(l)
            )?;
        }
        for (title, map) in [
            ("DLT", &self.by_dlt),
            ("CLASS", &self.by_class),
            ("RULE", &self.by_rule),
            ("ORIGIN PARTITION", &self.by_origin_partition),
            ("REASON", &self.by_reason),
        ] {
            writeln!(out)?;
            let mut rows: Vec<(&String, &u64)> = map.iter().collect();
            rows.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
            let rows: Vec<[String; 2]> = rows
                .into_iter()
                .map(|(k, n)| [n.to_string(), cut(k, 200)])
                .collect();
            write_aligned(out, &["COUNT", title], &rows)?;
        }
        if !self.breaker.is_empty() {
            writeln!(out)?;
            let rows: Vec<[String; 3]> = self
                .breaker
                .iter()
                .map(|(tp, what, at)| [tp.clone(), what.to_string(), at.to_string()])
                .collect();
            write_aligned(out, &["CIRCUIT BREAKER", "EVENT", "OFFSET"], &rows)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn rec(offset: i64, class: &str, rule: &str, reason: &str, partition: i32) -> DltRecord {
        DltRecord {
            dlt_topic: "geo.dlt".into(),
            dlt_partition: 0,
            dlt_offset: offset,
            timestamp: 0,
            origin_topic: Some("geo".into()),
            origin_partition: Some(partition),
            origin_offset: Some(offset * 10),
            origin_timestamp: Some(0),
            class: class.into(),
            rule: rule.into(),
            reason: reason.into(),
            policy: "p".into(),
            failed_at: Some(1_795_997_596_000 + offset),
            attempt: 0,
            redacted: false,
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from_static(b"{\"lat\":91}")),
            headers: vec![("idempotency-key".into(), Some(Bytes::from_static(b"i1")))],
            redrive: Vec::new(),
            contract_rule: None,
        }
    }

    #[test]
    fn table_is_aligned() {
        let rs = [
            rec(1, "poison", "coordinates", "/lat: 91", 0),
            rec(12, "stale", "max_age", "too old", 3),
        ];
        let mut out = Vec::new();
        write_table(&mut out, &rs).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("DLT"), "{text}");
        let col = |l: &str| {
            l.find("poison")
                .or_else(|| l.find("stale"))
                .or_else(|| l.find("CLASS"))
        };
        assert_eq!(col(lines[0]), col(lines[1]));
        assert_eq!(col(lines[1]), col(lines[2]));
        assert!(lines[1].contains("geo-0@10") && lines[2].contains("geo-3@120"));
        assert_eq!(lines[3], "(2 records)");
    }

    #[test]
    fn a_contract_rule_gets_its_own_column_only_when_a_record_names_one() {
        let plain = rec(1, "poison", "coordinates", "/lat: 91", 0);
        let mut text = Vec::new();
        write_table(&mut text, std::slice::from_ref(&plain)).unwrap();
        assert!(!String::from_utf8(text).unwrap().contains("CONTRACT RULE"));
        let mut ruled = rec(2, "poison", "rule:north", "north failed", 0);
        ruled.contract_rule = Some(crate::replay::ContractRule {
            name: "north".into(),
            mode: "READ".into(),
            subject: "geo-value".into(),
            topic: "geo".into(),
            exception: "north failed".into(),
        });
        let mut out = Vec::new();
        write_table(&mut out, &[plain, ruled.clone()]).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("CONTRACT RULE"), "{text}");
        let col = lines[0].find("CONTRACT RULE").unwrap();
        assert_eq!(lines[1][col..].split("  ").next(), Some("-"), "{text}");
        assert!(
            lines[2][col..].starts_with("north READ geo-value"),
            "{text}"
        );
        let j = record_json(&ruled);
        assert_eq!(j["contract_rule"]["name"], "north");
        assert_eq!(j["contract_rule"]["subject"], "geo-value");
        assert_eq!(
            record_json(&rec(3, "poison", "x", "y", 0))["contract_rule"],
            Value::Null
        );
    }

    #[test]
    fn summary_counts_by_class_rule_reason_and_origin() {
        let rs = [
            rec(1, "poison", "coordinates", "/lat: 91", 0),
            rec(2, "poison", "coordinates", "/lat: 91", 0),
            rec(3, "stale", "max_age", "too old", 1),
        ];
        let s = Summary::of(&rs);
        assert_eq!(s.total, 3);
        assert_eq!(s.by_class["poison"], 2);
        assert_eq!(s.by_rule["max_age"], 1);
        assert_eq!(s.by_reason["/lat: 91"], 2);
        assert_eq!(s.by_origin_partition["geo-1"], 1);
        let j = s.to_json();
        assert_eq!(j["by_class"]["stale"], 1);
        let mut out = Vec::new();
        s.write_table(&mut out).unwrap();
        assert!(String::from_utf8(out).unwrap().contains("2      poison"));
    }

    #[test]
    fn json_has_origin_and_context() {
        let j = record_json(&rec(5, "poison", "schema", "bad", 2));
        assert_eq!(j["origin_offset"], 50);
        assert_eq!(j["class"], "poison");
        assert_eq!(j["key"], "k");
        assert_eq!(j["headers"][0]["key"], "idempotency-key");
        assert!(j["failed_at"].as_str().unwrap().ends_with('Z'));
    }

    #[test]
    fn no_output_form_carries_a_raw_control_character() {
        let esc = "\x1b]2;owned\x07\x1b[2J\u{9b}1m";
        let mut r = rec(5, "poison", "schema", &format!("bad {esc}"), 2);
        r.key = Some(Bytes::from(format!("k{esc}")));
        r.value = Some(Bytes::from(format!("v{esc}")));
        r.headers
            .push((format!("h{esc}"), Some(Bytes::from(format!("x{esc}")))));
        r.origin_topic = Some(format!("geo{esc}"));
        let mut table = Vec::new();
        write_table(&mut table, &[r.clone()]).unwrap();
        let mut summary = Vec::new();
        Summary::of(&[r.clone()]).write_table(&mut summary).unwrap();
        let json = record_json(&r).to_string();
        let summary_json = Summary::of(&[r]).to_json().to_string();
        for out in [
            String::from_utf8(table).unwrap(),
            String::from_utf8(summary).unwrap(),
            json,
            summary_json,
        ] {
            assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
            assert!(!out.contains("\\u001b") && !out.contains('\u{9b}'), "{out}");
        }
    }
}
