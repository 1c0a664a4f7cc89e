//! The registry against its documented contract: names, types and labels
//! as the README and docs/operations.md, the alert rules and the dashboard
//! use them; cached series.

use std::hash::Hash;

use super::series::*;
use super::*;
use crate::policy::{Action, Class};

#[test]
fn renders_help_type_and_samples() {
    let m = Metrics::new();
    m.record_validated("geo", 0, "p", 10);
    m.record_validated("geo", 0, "p", 5);
    m.record_passed("geo", 0, "p", 14);
    m.record_invalid(
        "geo",
        0,
        "p",
        Class::Poison,
        "schema",
        InvalidAction::Met(Action::Divert),
    );
    let text = m.render();
    assert!(
        text.contains("# HELP antidote_records_validated_total Records judged against a policy.\n")
    );
    assert!(text.contains("# TYPE antidote_records_validated_total counter\n"));
    assert!(
        text.contains(
            "antidote_records_validated_total{topic=\"geo\",partition=\"0\",policy=\"p\"} 15\n"
        ),
        "{text}"
    );
    assert!(text.contains(
        "antidote_records_passed_total{topic=\"geo\",partition=\"0\",policy=\"p\"} 14\n"
    ));
    assert!(text.contains(
        "antidote_records_invalid_total{topic=\"geo\",partition=\"0\",policy=\"p\",class=\"poison\",rule=\"schema\",action=\"diverted\"} 1\n"
    ));
    assert!(text.contains("antidote_build_info{version=\""));
    // Every non-comment line is `name{labels} value` with a numeric value.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let value = line.rsplit(' ').next().unwrap_or("");
        assert!(
            value.parse::<f64>().is_ok() || value == "+Inf",
            "bad line {line}"
        );
    }
    assert_eq!(m.validated("geo", 0, "p"), 15);
}

#[test]
fn label_values_are_escaped() {
    let m = Metrics::new();
    m.record_invalid(
        "t",
        1,
        "p",
        Class::Unknown,
        "rule \"x\"\n\\",
        InvalidAction::Met(Action::Drop),
    );
    let text = m.render();
    assert!(
        text.contains(r#"rule="rule \"x\"\n\\",action="dropped"} 1"#),
        "{text}"
    );
    assert!(
        !text.lines().any(|l| l.ends_with('\\')),
        "no raw newline inside a sample"
    );
}

#[test]
fn histogram_buckets_are_cumulative() {
    let m = Metrics::new();
    m.dlt_write_result("ok", Duration::from_micros(300));
    m.dlt_write_result("ok", Duration::from_millis(30));
    m.dlt_write_result("error", Duration::from_secs(60));
    let text = m.render();
    assert!(text.contains("# TYPE antidote_dlt_write_duration_seconds histogram\n"));
    assert!(
        text.contains(
            "antidote_dlt_write_duration_seconds_bucket{result=\"ok\",le=\"0.0005\"} 1\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("antidote_dlt_write_duration_seconds_bucket{result=\"ok\",le=\"0.05\"} 2\n")
    );
    assert!(
        text.contains("antidote_dlt_write_duration_seconds_bucket{result=\"ok\",le=\"+Inf\"} 2\n")
    );
    assert!(
        text.contains("antidote_dlt_write_duration_seconds_bucket{result=\"error\",le=\"10\"} 0\n")
    );
    assert!(text
        .contains("antidote_dlt_write_duration_seconds_bucket{result=\"error\",le=\"+Inf\"} 1\n"));
    assert!(text.contains("antidote_dlt_write_duration_seconds_count{result=\"ok\"} 2\n"));
    assert!(text.contains("antidote_dlt_write_duration_seconds_sum{result=\"error\"} 60.0\n"));
    assert!(text.contains("antidote_dlt_writes_total{result=\"error\"} 1\n"));
    m.fetch_rewrite_latency(Duration::from_millis(2));
    assert!(m
        .render()
        .contains("antidote_fetch_rewrite_duration_seconds_count 1\n"));
}

#[test]
fn gauges_go_up_and_down() {
    let m = Metrics::new();
    m.connections_open("bootstrap", 1);
    m.connections_open("bootstrap", 1);
    m.connections_open("bootstrap", -1);
    assert_eq!(m.open_connections("bootstrap"), 1);
    m.set_held("geo", 3, true);
    m.set_held("geo", 4, true);
    m.set_held("geo", 4, false);
    assert_eq!(m.held_partitions(), 1);
    let text = m.render();
    assert!(text.contains("antidote_connections_open{listener=\"bootstrap\"} 1\n"));
    assert!(text.contains("antidote_connections_accepted_total{listener=\"bootstrap\"} 2\n"));
    assert!(text.contains("antidote_held_partitions{topic=\"geo\",partition=\"3\"} 1\n"));
    assert!(text.contains("antidote_held_partitions{topic=\"geo\",partition=\"4\"} 0\n"));
}

#[test]
fn connection_guard_counts_while_alive() {
    let m = Arc::new(Metrics::new());
    let a = ConnectionGuard::new(m.clone(), "broker-111");
    {
        let _b = ConnectionGuard::new(m.clone(), "broker-111");
        assert_eq!(m.open_connections("broker-111"), 2);
    }
    assert_eq!(m.open_connections("broker-111"), 1);
    drop(a);
    assert_eq!(m.open_connections("broker-111"), 0);
}

#[test]
fn concurrent_recording_loses_nothing() {
    let m = Arc::new(Metrics::new());
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let m = m.clone();
            std::thread::spawn(move || {
                for i in 0..1000 {
                    m.record_validated("t", i % 3, "p", 1);
                    m.upstream_error("io");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let total: u64 = (0..3).map(|p| m.validated("t", p, "p")).sum();
    assert_eq!(total, 4000);
    assert!(m
        .render()
        .contains("antidote_upstream_errors_total{kind=\"io\"} 4000\n"));
}

/// Every `antidote_*` name used by the shipped alert rules and dashboard
/// is one this registry exports, and both files parse.
#[test]
fn ops_files_parse_and_use_exported_names() {
    let alerts = include_str!("../../ops/prometheus-alerts.yaml");
    let dashboard = include_str!("../../ops/grafana-dashboard.json");
    let yaml: serde_yaml::Value = serde_yaml::from_str(alerts).unwrap();
    assert!(yaml["groups"].as_sequence().is_some_and(|g| !g.is_empty()));
    let json: serde_json::Value = serde_json::from_str(dashboard).unwrap();
    assert!(json["panels"].as_array().is_some_and(|p| !p.is_empty()));
    let exported: std::collections::HashSet<String> = every_series_once()
        .render()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .flat_map(|n| {
            [
                n.to_string(),
                format!("{n}_bucket"),
                format!("{n}_sum"),
                format!("{n}_count"),
            ]
        })
        .collect();
    for text in [alerts, dashboard] {
        let mut rest = text;
        while let Some(i) = rest.find("antidote_") {
            let name: String = rest[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                exported.contains(&name),
                "{name} is not exported by src/metrics.rs"
            );
            rest = &rest[i + name.len()..];
        }
    }
}

/// A registry with one series in every family.
fn every_series_once() -> Metrics {
    let m = Metrics::new();
    m.record_validated("t", 0, "p", 1);
    m.record_evaluated("p", 1);
    m.record_passed("t", 0, "p", 1);
    m.record_invalid(
        "t",
        0,
        "p",
        Class::Poison,
        "r",
        InvalidAction::Met(Action::Drop),
    );
    m.dlt_write_result("ok", Duration::from_millis(1));
    m.response_relayed(true, Duration::from_micros(100), Duration::from_micros(300));
    m.set_held("t", 0, false);
    m.held_batch("t", 0, "budget");
    m.connections_open("bootstrap", 1);
    m.upstream_error("io");
    m.registry_request("ok");
    m.keys.redriven(true, 1);
    m.dlt_written(DltWriteSeen {
        written: 1,
        ..DltWriteSeen::default()
    });
    m.dlt_record_refused("ledger", "unsigned");
    m.breaker.tripped("t", 0, "p");
    m.hold
        .diverting_response(Duration::from_micros(2500), Duration::from_micros(2000));
    m.requests.request(0, 13);
    m.share.acks("sent", 1);
    m.share.withheld("dlt", 1);
    m.share.renewals("sent", 1);
    m.share.fallback("no_v2", 1);
    m.contract.touch("t-value", "r");
    m
}

/// A diverting response's hold splits into the proxy's part and the DLT
/// wait, each in the relay's fine buckets.
#[test]
fn a_diverting_hold_is_split_into_proxy_and_dlt() {
    let text = every_series_once().render();
    for (part, le) in [("proxy", "0.0005"), ("dlt", "0.002")] {
        let bucket = format!(
            "antidote_fetch_diverting_hold_seconds_bucket{{part=\"{part}\",le=\"{le}\"}} 1"
        );
        assert!(text.contains(&bucket), "{bucket} in {text}");
    }
    let below = "antidote_fetch_diverting_hold_seconds_bucket{part=\"proxy\",le=\"0.00025\"} 0";
    assert!(text.contains(below), "{text}");
}

/// The `# TYPE` lines, on a fresh registry with no series yet, are
/// exactly those of the hand-written registry this one replaced (scraped
/// before the switch), in the same order: names with `_total`, same
/// types.
#[test]
fn type_lines_are_those_of_the_old_exposition() {
    let want = [
        "antidote_build_info gauge",
        "antidote_process_start_time_seconds gauge",
        "antidote_records_validated_total counter",
        "antidote_records_evaluated_total counter",
        "antidote_fetch_rewrite_cpu_seconds_total counter",
        "antidote_records_passed_total counter",
        "antidote_records_invalid_total counter",
        "antidote_dlt_writes_total counter",
        "antidote_dlt_write_duration_seconds histogram",
        "antidote_held_partitions gauge",
        "antidote_held_batches_total counter",
        "antidote_fetch_rewrite_duration_seconds histogram",
        // Added with the relay latency (issue 15).
        "antidote_response_relay_duration_seconds histogram",
        "antidote_connections_open gauge",
        "antidote_connections_accepted_total counter",
        "antidote_upstream_errors_total counter",
        "antidote_connections_refused_total counter",
        // Added after the switch (issue 11).
        "antidote_schema_registry_requests_total counter",
        // Added with per-key ordering and re-drive (metrics/keys.rs).
        "antidote_blocked_keys gauge",
        "antidote_blocked_key_oldest_age_seconds gauge",
        "antidote_redrive_total counter",
        "antidote_dlt_diversions_total counter",
        "antidote_dlt_ledger_lag_records gauge",
        // Added with signed DLT records (issue 28, dlt/trust.rs).
        "antidote_dlt_records_refused_total counter",
        // Added with the diversion circuit breaker (issue 33, metrics/breaker.rs).
        "antidote_breaker_open gauge",
        "antidote_breaker_trips_total counter",
        // Added with judging ahead (issue 15, filter/parallel.rs).
        "antidote_fetch_judged_ahead_records_total counter",
        // Added with the judging deadline (issue 30, intercept/fetch/parallel.rs).
        "antidote_fetch_deadline_cuts_total counter",
        // Added with the diverting hold's split (issue 30, metrics/observation.rs).
        "antidote_fetch_diverting_hold_seconds histogram",
        // Added with Kafka 4.4 (issue 48, metrics/requests.rs).
        "antidote_client_requests_total counter",
        // Added with share groups (issue 49, metrics/share.rs).
        "antidote_share_acks_total counter",
        "antidote_share_withheld_records_total counter",
        // Added with renewals of withheld records (issue 54, metrics/share.rs).
        "antidote_share_renewals_total counter",
        "antidote_share_renew_fallbacks_total counter",
        "antidote_share_withheld_ranges gauge",
        "antidote_share_withheld_bytes gauge",
        // Added with data-contract rules (issue 56, metrics/contract.rs).
        "antidote_contract_rule_none_total counter",
    ];
    let text = Metrics::new().render();
    let got: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .collect();
    assert_eq!(got, want, "{text}");
    // Label-less counters are exported from the start, at zero.
    assert!(
        text.contains("\nantidote_connections_refused_total 0\n"),
        "{text}"
    );
    assert!(
        text.contains("\nantidote_fetch_rewrite_cpu_seconds_total 0.0\n"),
        "{text}"
    );
}

/// Every `antidote_*` name the README and the operations manual document
/// is exported, so a metric cannot disappear while the docs still promise
/// it.
#[test]
fn every_metric_named_in_the_readme_is_exported() {
    let readme = concat!(
        include_str!("../../README.md"),
        include_str!("../../docs/operations.md")
    );
    let text = every_series_once().render();
    let exported: std::collections::HashSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let mut documented = 0;
    let mut rest = readme;
    while let Some(i) = rest.find("antidote_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let histogram = format!("{name}_count");
        assert!(
            exported.contains(name.as_str()) || exported.contains(histogram.as_str()),
            "README documents {name}, which /metrics does not export"
        );
        documented += 1;
        rest = &rest[i + name.len()..];
    }
    assert!(
        documented >= 14,
        "README metric table not found ({documented} names)"
    );
}

/// Recording on a known label set goes through the cache: the family
/// and the cache hold the same series, and a scrape sees later adds.
#[test]
fn cached_series_are_the_ones_scraped() {
    let m = Metrics::new();
    m.record_validated("t", 0, "p", 1);
    assert_eq!(m.validated.cache.len(), 1);
    for _ in 0..10 {
        m.record_validated("t", 0, "p", 1);
    }
    assert_eq!(m.validated.cache.len(), 1);
    assert!(m.render().contains(
        "antidote_records_validated_total{topic=\"t\",partition=\"0\",policy=\"p\"} 11\n"
    ));
}

/// Borrowed label values find the series their owned form created, and
/// series whose hashes collide share a bucket without mixing counts.
#[test]
fn borrowed_lookups_hit_and_collisions_stay_apart() {
    let m = Metrics::new();
    for _ in 0..3 {
        m.record_invalid(
            "t",
            1,
            "p",
            Class::Poison,
            "r1",
            InvalidAction::Met(Action::Divert),
        );
    }
    m.record_invalid(
        "t",
        1,
        "p",
        Class::Poison,
        "r2",
        InvalidAction::Met(Action::Divert),
    );
    assert_eq!(m.invalid.cache.len(), 2);
    let text = m.render();
    assert!(
        text.contains("rule=\"r1\",action=\"diverted\"} 3\n"),
        "{text}"
    );
    assert!(
        text.contains("rule=\"r2\",action=\"diverted\"} 1\n"),
        "{text}"
    );

    /// A listener name whose hash is always the same.
    struct Colliding<'a>(&'a str);
    impl Hash for Colliding<'_> {
        fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
    }
    impl LabelsRef<ListenerLabel> for Colliding<'_> {
        fn is(&self, o: &ListenerLabel) -> bool {
            o.listener == self.0
        }
        fn to_labels(&self) -> ListenerLabel {
            ListenerLabel {
                listener: self.0.to_owned(),
            }
        }
    }
    let c: Cached<ListenerLabel, Counter> = Cached::new();
    c.with(&Colliding("a"), |c| c.inc_by(2));
    c.with(&Colliding("b"), |c| c.inc());
    c.with(&Colliding("a"), |c| c.inc());
    assert_eq!(c.cache.len(), 1, "one bucket");
    assert_eq!(c.peek(&Colliding("a"), |c| c.get()), Some(3));
    assert_eq!(c.peek(&Colliding("b"), |c| c.get()), Some(1));
    assert_eq!(c.peek(&Colliding("z"), |c| c.get()), None);
}

/// One response's observation becomes its series once: invalid records
/// of one class and rule counted together (3, not 1), the held gauge and
/// the held batch's reason set, a share session's dropped acknowledgements
/// counted.
#[test]
fn an_observation_becomes_its_series() {
    let text = "policies:\n  - name: p\n    topics: [geo]\n    value:\n      format: json\n";
    let set =
        crate::policy::PolicySet::parse(text, std::path::Path::new("/tmp/p.yaml")).expect("policy");
    let policy = set.for_topic("geo").expect("covers geo").clone();
    let invalid = |rule: &str| crate::policy::Invalid {
        class: Class::Poison,
        rule: rule.into(),
        reason: "r".into(),
        contract: None,
    };
    let mut j = Judged {
        topic: "geo".into(),
        partition: 2,
        policy,
        evaluated: 4,
        judged: 9,
        passed: 5,
        invalid: Vec::new(),
    };
    for _ in 0..3 {
        j.invalid(&invalid("schema"), InvalidAction::Met(Action::Divert));
    }
    j.invalid(&invalid("schema"), InvalidAction::Met(Action::Drop));
    assert_eq!(j.invalid.len(), 2, "one entry per class, rule and action");
    let m = Metrics::new();
    let mut seen = Observation::start();
    seen.partitions.push(j);
    seen.held_batches.push(("geo".into(), 2, "budget"));
    seen.held.push(("geo".into(), 2, true));
    seen.deadline_cuts = 2;
    m.observe(seen);
    let text = m.render();
    has_lines(
        &text,
        &[
            "antidote_records_validated_total{topic=\"geo\",partition=\"2\",policy=\"p\"} 9\n",
            "antidote_records_passed_total{topic=\"geo\",partition=\"2\",policy=\"p\"} 5\n",
            "antidote_records_invalid_total{topic=\"geo\",partition=\"2\",policy=\"p\",class=\"poison\",rule=\"schema\",action=\"diverted\"} 3\n",
            "antidote_records_invalid_total{topic=\"geo\",partition=\"2\",policy=\"p\",class=\"poison\",rule=\"schema\",action=\"dropped\"} 1\n",
            "antidote_held_batches_total{topic=\"geo\",partition=\"2\",reason=\"budget\"} 1\n",
            "\nantidote_fetch_deadline_cuts_total 2\n",
            "antidote_fetch_rewrite_duration_seconds_count 1\n",
        ],
    );
    assert_eq!(m.held_partitions(), 1);
    assert!(
        !text.contains("result=\"overflow\""),
        "none dropped: {text}"
    );
    let mut seen = Observation::start();
    seen.share.acks("overflow", 3);
    m.observe(seen);
    assert!(m.render().contains("result=\"overflow\"} 3\n"));
}

#[test]
fn share_bookkeeping_seen_once_becomes_its_series() {
    let m = Metrics::new();
    let mut seen = ShareSeen::default();
    seen.acks("sent", 4);
    seen.acks("refused", 0);
    seen.withheld("dlt", 2);
    seen.renewals("sent", 3);
    seen.fallback("budget", 1);
    seen.fallback("expired", 2);
    seen.kept(2, 5, 640);
    m.share_seen(seen);
    let text = m.render();
    has_lines(
        &text,
        &[
            "antidote_share_acks_total{result=\"sent\"} 4\n",
            "antidote_share_withheld_records_total{reason=\"dlt\"} 2\n",
            "antidote_share_renewals_total{result=\"sent\"} 3\n",
            "antidote_share_renew_fallbacks_total{reason=\"budget\"} 1\n",
            "antidote_share_renew_fallbacks_total{reason=\"expired\"} 2\n",
            "antidote_share_withheld_ranges 5\n",
            "antidote_share_withheld_bytes 640\n",
        ],
    );
    assert!(!text.contains("result=\"refused\""), "none refused: {text}");
    let mut seen = ShareSeen::default();
    seen.fallback("refused", 1);
    seen.kept(1, 9, 1152);
    m.share_seen(seen);
    let text = m.render();
    assert!(
        text.contains("antidote_share_withheld_ranges 5\n"),
        "an earlier reading reported late does not overwrite a later one: {text}"
    );
}

#[test]
fn a_dlt_write_observation_becomes_its_series() {
    let m = Metrics::new();
    m.dlt_written(DltWriteSeen {
        produced: vec![
            (Produced::Retimed, Duration::from_millis(2)),
            (Produced::Ok, Duration::from_millis(3)),
            (Produced::Ok, Duration::from_millis(4)),
            (Produced::TooLarge, Duration::from_millis(5)),
        ],
        written: 7,
        found_at_write: 2,
        fenced: 1,
        lease_failed: 0,
    });
    let text = m.render();
    has_lines(
        &text,
        &[
            "antidote_dlt_writes_total{result=\"ok\"} 2\n",
            "antidote_dlt_writes_total{result=\"retimed\"} 1\n",
            "antidote_dlt_writes_total{result=\"too_large\"} 1\n",
            "antidote_dlt_writes_total{result=\"fenced\"} 1\n",
            "antidote_dlt_write_duration_seconds_sum{result=\"ok\"} 0.007\n",
            "antidote_dlt_write_duration_seconds_count{result=\"fenced\"} 1\n",
            "antidote_dlt_diversions_total{source=\"written\"} 7\n",
            "antidote_dlt_diversions_total{source=\"found_at_write\"} 2\n",
        ],
    );
    for absent in ["result=\"error\"", "result=\"lease_failed\""] {
        assert!(!text.contains(absent), "nothing {absent}: {text}");
    }
    // A write that only failed to take the lease: one series, no records.
    m.dlt_written(DltWriteSeen {
        lease_failed: 1,
        ..DltWriteSeen::default()
    });
    let text = m.render();
    assert!(text.contains("antidote_dlt_writes_total{result=\"lease_failed\"} 1\n"));
    assert!(text.contains("antidote_dlt_diversions_total{source=\"written\"} 7\n"));
}

/// A follower round's observation sets what it saw, and only that: a round
/// that read no DLT leaves the lag and the blocked keys as they were.
#[test]
fn a_follower_round_observation_becomes_its_series() {
    let m = Metrics::new();
    m.follower_round(
        FollowerSeen {
            learned: 3,
            ledger_lag: Some(12),
            blocked: Some((2, Some(1_000))),
        },
        4_500,
    );
    m.follower_round(FollowerSeen::default(), 9_000);
    let text = m.render();
    has_lines(
        &text,
        &[
            "antidote_dlt_diversions_total{source=\"learned\"} 3\n",
            "antidote_dlt_ledger_lag_records 12\n",
            "antidote_blocked_keys 2\n",
            "antidote_blocked_key_oldest_age_seconds 3.5\n",
        ],
    );
}

#[test]
fn a_door_observation_becomes_its_series() {
    let m = Metrics::new();
    let mut seen = DoorSeen::default();
    seen.refused(("geo", 1), "p", Class::Poison, "schema", 3);
    seen.refused(("geo", 1), "p", Class::Poison, "batch", 1);
    seen.waiting("geo", 2);
    m.door_seen(seen);
    let text = m.render();
    has_lines(
        &text,
        &[
            "antidote_records_invalid_total{topic=\"geo\",partition=\"1\",policy=\"p\",class=\"poison\",rule=\"schema\",action=\"rejected\"} 3\n",
            "antidote_records_invalid_total{topic=\"geo\",partition=\"1\",policy=\"p\",class=\"poison\",rule=\"batch\",action=\"rejected\"} 1\n",
            "antidote_held_batches_total{topic=\"geo\",partition=\"2\",reason=\"transient\"} 1\n",
        ],
    );
}

/// Every one of `lines` is in the rendered `text`.
fn has_lines(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
}
