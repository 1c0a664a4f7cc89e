//! The console's JSON API (documented in docs/operations.md, "The DLT
//! console"): each handler checks its parameters ([`Params`]), calls the
//! `service` operation the `dlt` commands call, and serialises its typed
//! result through [`view`].

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use hyper::StatusCode;
use serde_json::{json, Value};

use super::query::Params;
use super::{view, Console, Refusal, READ_DEADLINE};
use crate::clock::now_ms;
use crate::metrics::{self, history};
use crate::service::browse::{self, PageRequest, Position};
use crate::service::replay::{Outcome, ReplayPlan, Report, Sink};
use crate::service::{DltError, Filters};

/// An answer: its status and JSON body.
pub type Answer = Result<(StatusCode, Value), Refusal>;

/// Records of a page at most, and by default.
const MAX_PAGE: i64 = 200;
const DEFAULT_PAGE: i64 = 50;
/// Records read at most for one page (matching or not).
const SCAN: u64 = 20_000;
/// Records a preview considers at most, and by default.
const MAX_PREVIEW: i64 = 1000;
const DEFAULT_PREVIEW: i64 = 100;
/// Bytes of keys and values a preview or replay holds at most.
const MAX_REPLAY_BYTES: usize = 64 << 20;
/// Bytes of keys and values a page holds at most (its values are cut
/// for showing; the records are held whole until then).
const MAX_PAGE_BYTES: usize = 16 << 20;
/// Outcomes kept for the page (a blocked key can bring more records).
const MAX_OUTCOMES: usize = 1000;
/// Rows of the overview's tables at most.
const MAX_ROWS: usize = 500;
/// Seconds between the page's refreshes of the overview.
pub const REFRESH_SECONDS: u64 = 5;

fn bad(m: String) -> Refusal {
    (StatusCode::BAD_REQUEST, m)
}

fn refused(e: DltError) -> Refusal {
    match e {
        DltError::Usage(m) => (StatusCode::BAD_REQUEST, m),
        DltError::Policy(m) | DltError::Config(m) => (StatusCode::INTERNAL_SERVER_ERROR, m),
        other => (StatusCode::BAD_GATEWAY, other.to_string()),
    }
}

/// `GET /console/api/overview`: no Kafka read; the metrics, the history,
/// the breakers and the blocked keys as they are now.
pub fn overview(c: &Console, q: Option<&str>) -> Answer {
    Params::query(q, &[]).map_err(bad)?;
    let m = metrics::global();
    let now = now_ms();
    let h = history::global().snapshot(now);
    let series: Vec<Value> = h
        .series
        .iter()
        .map(|s| {
            json!({"topic": s.topic, "class": s.class, "counts": s.counts,
            "total": s.counts.iter().sum::<u64>()})
        })
        .collect();
    let invalid = m.invalid_counts();
    let mut diverted: std::collections::BTreeMap<(&str, &str), u64> = Default::default();
    for i in invalid.iter().filter(|i| i.action == "diverted") {
        *diverted.entry((i.topic.as_str(), i.class)).or_default() += i.count;
    }
    let rows: Vec<Value> = invalid
        .iter()
        .take(MAX_ROWS)
        .map(|i| {
            json!({"topic": i.topic, "partition": i.partition, "policy": i.policy,
            "class": i.class, "rule": i.rule, "action": i.action, "count": i.count})
        })
        .collect();
    let held: Vec<Value> = m
        .held_now()
        .into_iter()
        .take(MAX_ROWS)
        .map(|(t, p)| {
            let reason = history::global().hold_reason(&t, p);
            json!({"topic": t, "partition": p, "reason": reason})
        })
        .collect();
    let breakers: Vec<Value> = c
        .breakers
        .open_now()
        .into_iter()
        .take(MAX_ROWS)
        .map(|(t, p, at)| json!({"topic": t, "partition": p, "held_at": at}))
        .collect();
    let (blocked, oldest) = c.blocked.summary();
    let keys: Vec<Value> = c
        .blocked
        .list(100)
        .into_iter()
        .map(|k| {
            let key = c
                .contents()
                .then(|| crate::service::show_bytes(Some(&k.key)));
            json!({"topic": k.topic, "partition": k.partition, "key": key,
                "key_size": k.key.len(), "first_offset": k.first, "last_offset": k.last,
                "since_ms": k.since_ms, "class": k.class.as_str()})
        })
        .collect();
    Ok((
        StatusCode::OK,
        json!({
            "now_ms": now,
            "version": env!("CARGO_PKG_VERSION"),
            "settings": {"record_contents": c.contents(), "actions": c.actions(),
                "refresh_seconds": REFRESH_SECONDS},
            "history": {"first_minute_ms": h.first_minute_ms, "minutes": history::MINUTES,
                "max_series": history::MAX_SERIES, "series": series},
            "diverted": diverted.iter().map(|((t, cl), n)| json!({"topic": t, "class": cl, "count": n})).collect::<Vec<_>>(),
            "invalid": rows,
            "invalid_rows": invalid.len(),
            "held": held,
            "breakers": breakers,
            "blocked_keys": {"count": blocked,
                "oldest_age_seconds": oldest.map(|o| (now - o).max(0) / 1000), "keys": keys},
            "ledger_lag": m.ledger_lag(),
        }),
    ))
}

/// `GET /console/api/dlts`: the existing DLTs of the current policies.
pub async fn dlts(c: &Console, q: Option<&str>) -> Answer {
    Params::query(q, &[]).map_err(bad)?;
    let ctx = c.context();
    let topics = c
        .off_runtime(READ_DEADLINE, move || async move {
            let mut cluster = ctx.dead_letter_cluster()?;
            ctx.existing_dead_letter_topics(&mut cluster).await
        })
        .await?
        .map_err(refused)?;
    Ok((StatusCode::OK, json!({ "topics": topics })))
}

/// The filters of a query (`class`, `rule`, `origin_partition`, `since`,
/// `until`).
fn filters(p: &Params) -> Result<Filters, String> {
    Ok(Filters {
        class: p.class("class")?,
        rule: p.text("rule").map(str::to_string),
        origin_partition: p
            .int("origin_partition", 0, i32::MAX.into())?
            .map(|n| n as i32),
        since: p.time("since")?,
        until: p.time("until")?,
        ..Filters::default()
    })
}

const FILTERS: [&str; 5] = ["class", "rule", "origin_partition", "since", "until"];

/// `GET /console/api/records`: one page of a DLT, decoded.
pub async fn records(c: &Console, q: Option<&str>) -> Answer {
    let mut known = vec!["topic", "partition", "offset", "limit", "decode"];
    known.extend(FILTERS);
    let p = Params::query(q, &known).map_err(bad)?;
    let topic = p.topic("topic").map_err(bad)?;
    let filters = filters(&p).map_err(bad)?;
    let limit = p
        .int("limit", 1, MAX_PAGE)
        .map_err(bad)?
        .unwrap_or(DEFAULT_PAGE) as usize;
    let from = match (
        p.int("partition", 0, i32::MAX.into()).map_err(bad)?,
        p.int("offset", 0, i64::MAX).map_err(bad)?,
    ) {
        (Some(partition), Some(offset)) => Some(Position {
            partition: partition as i32,
            offset,
        }),
        (None, None) => None,
        _ => return Err(bad("`partition` and `offset` go together".into())),
    };
    let decode = p.text("decode").is_none() || p.flag("decode").map_err(bad)?;
    let contents = c.contents();
    let ctx = c.context();
    let page = c
        .off_runtime(READ_DEADLINE, move || async move {
            let mut cluster = ctx.dead_letter_cluster()?;
            let req = PageRequest {
                topic: &topic,
                from,
                filters: &filters,
                limit,
                scan: SCAN,
                max_bytes: MAX_PAGE_BYTES,
            };
            let page = browse::page(&mut cluster, &req).await?;
            let registry = if decode && contents {
                crate::service::decode::registry(&ctx)?
            } else {
                None
            };
            let mut shown = Vec::with_capacity(page.records.len());
            for r in &page.records {
                let decoded = if decode && view::withheld(r, contents).is_none() {
                    Some(crate::service::decode::decoded(&ctx, registry.as_ref(), r).await)
                } else {
                    None
                };
                shown.push(view::record(r, decoded, contents));
            }
            Ok::<_, DltError>(json!({
                "topic": topic,
                "records": shown,
                "next": page.next.map(|n| json!({"partition": n.partition, "offset": n.offset})),
                "scanned": page.scanned,
                "partitions": page.partitions.iter().map(|s| json!({"partition": s.partition,
                    "start": s.start, "end": s.end})).collect::<Vec<_>>(),
                "record_contents": contents,
            }))
        })
        .await?
        .map_err(refused)?;
    Ok((StatusCode::OK, page))
}

/// The replay plan of a query or body.
fn plan(p: &Params, max: i64, default: i64) -> Result<ReplayPlan, String> {
    let mut plan = ReplayPlan::new(p.topic("topic")?);
    plan.to = match p.text("to") {
        Some(_) => Some(p.topic("to")?),
        None => None,
    };
    plan.from_offset = p.int("from_offset", 0, i64::MAX)?;
    plan.to_offset = p.int("to_offset", 0, i64::MAX)?;
    plan.include_stale = p.flag("include_stale")?;
    if let Some(n) = p.int("max_attempts", 1, 1000)? {
        plan.max_attempts = n as u32;
    }
    plan.limit = Some(p.int("limit", 1, max)?.unwrap_or(default) as usize);
    plan.max_bytes = Some(MAX_REPLAY_BYTES);
    plan.filters = filters(p)?;
    Ok(plan)
}

const PLAN: [&str; 7] = [
    "topic",
    "to",
    "from_offset",
    "to_offset",
    "include_stale",
    "max_attempts",
    "limit",
];

fn report_json(r: &Report) -> Value {
    json!({"considered": r.considered, "replayed": r.replayed, "would_replay": r.would_replay,
        "already_replayed": r.already_replayed, "still_invalid": r.still_invalid,
        "refused": r.refused, "failed": r.failed})
}

/// Outcomes kept for the page, bounded.
struct Collect {
    outcomes: Vec<Value>,
    more: u64,
    notices: Vec<String>,
    contents: bool,
}

impl Sink for Collect {
    fn outcome(&mut self, o: Outcome, _: &Report) -> Result<(), DltError> {
        if self.outcomes.len() < MAX_OUTCOMES {
            self.outcomes.push(view::outcome(&o, self.contents));
        } else {
            self.more += 1;
        }
        Ok(())
    }

    fn notice(&mut self, text: &str) {
        self.notices.push(text.to_string());
    }
}

/// `GET /console/api/replay/preview`: `dlt replay`'s dry run.
pub async fn preview(c: &Console, q: Option<&str>) -> Answer {
    let mut known = PLAN.to_vec();
    known.extend(FILTERS);
    let p = Params::query(q, &known).map_err(bad)?;
    let plan = plan(&p, MAX_PREVIEW, DEFAULT_PREVIEW).map_err(bad)?;
    let contents = c.contents();
    let ctx = c.context();
    let out = c
        .off_runtime(READ_DEADLINE, move || async move {
            let mut sink = Collect {
                outcomes: Vec::new(),
                more: 0,
                notices: Vec::new(),
                contents,
            };
            let report = crate::service::replay::run(&ctx, &plan, &mut sink).await?;
            Ok::<_, DltError>(json!({"topic": plan.topic, "limit": plan.limit,
                "report": report_json(&report), "outcomes": sink.outcomes, "more": sink.more,
                "notices": sink.notices}))
        })
        .await?
        .map_err(refused)?;
    Ok((StatusCode::OK, out))
}

/// The console's replay run (one at a time), as the page polls it.
pub struct Job {
    id: u64,
    topic: String,
    started_ms: i64,
    finished_ms: Option<i64>,
    report: Report,
    outcomes: Vec<Value>,
    more: u64,
    error: Option<String>,
}

impl Job {
    fn to_json(&self) -> Value {
        json!({"id": self.id, "topic": self.topic, "started_ms": self.started_ms,
            "finished_ms": self.finished_ms, "running": self.finished_ms.is_none(),
            "report": report_json(&self.report), "outcomes": self.outcomes, "more": self.more,
            "error": self.error})
    }
}

/// Outcomes written into the shared job as they come.
struct Progress {
    job: Arc<Mutex<Option<Job>>>,
    contents: bool,
}

impl Sink for Progress {
    fn outcome(&mut self, o: Outcome, report: &Report) -> Result<(), DltError> {
        let mut g = self.job.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(j) = g.as_mut() {
            j.report = report.clone();
            if j.outcomes.len() < MAX_OUTCOMES {
                j.outcomes.push(view::outcome(&o, self.contents));
            } else {
                j.more += 1;
            }
        }
        Ok(())
    }
}

/// `POST /console/api/replay/execute` (actions only): start the replay
/// `dlt replay --execute` would run, with its rate limit and fencing.
pub fn execute(c: &Console, body: &[u8]) -> Answer {
    let mut known = PLAN.to_vec();
    known.extend(FILTERS);
    known.push("rate");
    let p = Params::json(body, &known).map_err(bad)?;
    let mut plan = plan(&p, MAX_PREVIEW, DEFAULT_PREVIEW).map_err(bad)?;
    plan.rate = p.number("rate", 0.1, 10_000.0).map_err(bad)?;
    plan.execute = true;
    let id = c.jobs.fetch_add(1, Ordering::Relaxed) + 1;
    {
        let mut g = c.job.lock().unwrap_or_else(|p| p.into_inner());
        if g.as_ref().is_some_and(|j| j.finished_ms.is_none()) {
            return Err((StatusCode::CONFLICT, "a replay is running already".into()));
        }
        *g = Some(Job {
            id,
            topic: plan.topic.clone(),
            started_ms: now_ms(),
            finished_ms: None,
            report: Report::default(),
            outcomes: Vec::new(),
            more: 0,
            error: None,
        });
    }
    let job = c.job.clone();
    let ctx = c.context();
    let contents = c.contents();
    tracing::info!(topic = %plan.topic, id, "console: replay started");
    let spawned = std::thread::Builder::new()
        .name("antidote-console-replay".into())
        .spawn(move || {
            let result = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(async {
                    let mut sink = Progress {
                        job: job.clone(),
                        contents,
                    };
                    crate::service::replay::run(&ctx, &plan, &mut sink).await
                }),
                Err(e) => Err(DltError::Output(e)),
            };
            let mut g = job.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(j) = g.as_mut() {
                j.finished_ms = Some(now_ms());
                match result {
                    Ok(r) => j.report = r,
                    Err(e) => j.error = Some(e.to_string()),
                }
                tracing::info!(id = j.id, report = %j.report.line(true), error = ?j.error, "console: replay finished");
            }
        });
    if let Err(e) = spawned {
        *c.job.lock().unwrap_or_else(|p| p.into_inner()) = None;
        return Err((StatusCode::SERVICE_UNAVAILABLE, format!("no thread: {e}")));
    }
    Ok((StatusCode::ACCEPTED, json!({ "job": id })))
}

/// `GET /console/api/replay/job`: the running or last replay.
pub fn job(c: &Console, q: Option<&str>) -> Answer {
    Params::query(q, &[]).map_err(bad)?;
    let g = c.job.lock().unwrap_or_else(|p| p.into_inner());
    Ok((
        StatusCode::OK,
        json!({ "job": g.as_ref().map(Job::to_json) }),
    ))
}

/// `POST /console/api/breaker/close` (actions only): `antidote breaker
/// close`.
pub async fn close(c: &Console, body: &[u8]) -> Answer {
    let p = Params::json(body, &["topic", "partition", "divert_through"]).map_err(bad)?;
    let topic = p.topic("topic").map_err(bad)?;
    let partition = p
        .int("partition", 0, i32::MAX.into())
        .map_err(bad)?
        .ok_or_else(|| bad("`partition` is required".into()))? as i32;
    let through = p.int("divert_through", 0, i64::MAX).map_err(bad)?;
    let ctx = c.context();
    let t = topic.clone();
    let closed = c
        .off_runtime(READ_DEADLINE, move || async move {
            crate::service::breaker::close(&ctx, &t, partition, through).await
        })
        .await?
        .map_err(refused)?;
    tracing::info!(%topic, partition, ?through, "console: breaker close");
    let result = match closed {
        crate::service::breaker::Closed::NotOpen => "not_open",
        crate::service::breaker::Closed::At { .. } => "closed",
    };
    Ok((
        StatusCode::OK,
        json!({"result": result, "line": closed.line(&topic, partition)}),
    ))
}
