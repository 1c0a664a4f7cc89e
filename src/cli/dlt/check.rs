//! `antidote check --connect`'s look at the dead-letter topics: each DLT
//! whose configuration can break a promise is reported (a warning, not a
//! failure: the operator decides).
//!
//! - retention (`retention.ms`) shorter than its origin topic's: the ledger
//!   is rebuilt from the DLTs, so once-only ends at the DLT's retention (a
//!   record fetched again after its DLT copy expired is written again);
//! - `cleanup.policy` other than `delete`: compaction keeps one record per
//!   key, so diversions of one key vanish from the ledger and from replay;
//! - a replication factor or `min.insync.replicas` below the origin's: a
//!   diverted record is then less durable than it was in its topic.

use std::collections::{BTreeSet, HashMap};

use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::{DescribeConfigsRequest, MetadataResponse};
use kafka_protocol::protocol::StrBytes;

use super::{Context, DltError};
use crate::client::Cluster;
use crate::policy::Class;

/// The configs read of each topic.
const KEYS: &[&str] = &["retention.ms", "cleanup.policy", "min.insync.replicas"];

/// One line per DLT config that can break a promise (empty: none).
pub async fn dlt_warnings(ctx: &Context) -> Result<Vec<String>, DltError> {
    let mut upstream = ctx.upstream_cluster()?;
    let mut dlt_cluster = ctx.dead_letter_cluster()?;
    let up_meta = upstream.metadata(None).await?;
    let dlt_meta = dlt_cluster.metadata(None).await?;
    let up_rf = replication(&up_meta);
    let dlt_rf = replication(&dlt_meta);
    // (origin, dlt) pairs that exist.
    let mut pairs: Vec<(String, String)> = Vec::new();
    for origin in up_rf.keys() {
        let Some(p) = ctx.policies.policing(origin) else {
            continue;
        };
        let dlts: BTreeSet<String> = Class::ALL
            .iter()
            .map(|&c| p.dead_letter_topic(origin, c))
            .collect();
        for dlt in dlts {
            if dlt_rf.contains_key(&dlt) && &dlt != origin {
                pairs.push((origin.clone(), dlt));
            }
        }
    }
    let origins: BTreeSet<String> = pairs.iter().map(|(o, _)| o.clone()).collect();
    let dlts: BTreeSet<String> = pairs.iter().map(|(_, d)| d.clone()).collect();
    let up_cfg = describe(&mut upstream, &origins).await?;
    let dlt_cfg = describe(&mut dlt_cluster, &dlts).await?;
    let mut out = Vec::new();
    for (origin, dlt) in &pairs {
        let (Some(o), Some(d)) = (up_cfg.get(origin), dlt_cfg.get(dlt)) else {
            continue;
        };
        let num =
            |m: &HashMap<String, String>, k: &str| m.get(k).and_then(|v| v.parse::<i64>().ok());
        // -1: forever.
        let forever = |v: i64| if v < 0 { i64::MAX } else { v };
        if let (Some(dr), Some(or)) = (num(d, "retention.ms"), num(o, "retention.ms")) {
            if forever(dr) < forever(or) {
                out.push(format!("dead-letter topic {dlt}: retention.ms {dr} is shorter than {origin}'s {or}: a record fetched again after its DLT copy expired is diverted again (once-only ends at the DLT's retention)"));
            }
        }
        if let Some(cp) = d.get("cleanup.policy").filter(|cp| cp.as_str() != "delete") {
            out.push(format!("dead-letter topic {dlt}: cleanup.policy is {cp}, not delete: compaction keeps one record per key, so diversions vanish from the ledger and from replay"));
        }
        if let (Some(drf), Some(orf)) = (dlt_rf.get(dlt), up_rf.get(origin)) {
            if drf < orf {
                out.push(format!(
                    "dead-letter topic {dlt}: replication factor {drf} is below {origin}'s {orf}"
                ));
            }
        }
        if let (Some(dm), Some(om)) = (num(d, "min.insync.replicas"), num(o, "min.insync.replicas"))
        {
            if dm < om {
                out.push(format!(
                    "dead-letter topic {dlt}: min.insync.replicas {dm} is below {origin}'s {om}"
                ));
            }
        }
    }
    Ok(out)
}

/// Topic -> replication factor (replicas of its first partition).
fn replication(meta: &MetadataResponse) -> HashMap<String, usize> {
    meta.topics
        .iter()
        .filter(|t| t.error_code == 0 && !t.is_internal)
        .filter_map(|t| {
            let name = t.name.as_ref()?.to_string();
            let rf = t.partitions.first().map_or(0, |p| p.replica_nodes.len());
            Some((name, rf))
        })
        .collect()
}

/// The [`KEYS`] configs of `topics`, by topic.
async fn describe(
    cluster: &mut Cluster,
    topics: &BTreeSet<String>,
) -> Result<HashMap<String, HashMap<String, String>>, DltError> {
    if topics.is_empty() {
        return Ok(HashMap::new());
    }
    let req = DescribeConfigsRequest::default().with_resources(
        topics
            .iter()
            .map(|t| {
                DescribeConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(StrBytes::from_string(t.clone()))
                    .with_configuration_keys(Some(
                        KEYS.iter().map(|k| StrBytes::from_static_str(k)).collect(),
                    ))
            })
            .collect(),
    );
    let resp = cluster.any().await?.send(req, 1, 4).await?;
    Ok(resp
        .results
        .into_iter()
        .filter(|r| r.error_code == 0)
        .map(|r| {
            let configs = r
                .configs
                .into_iter()
                .filter_map(|c| Some((c.name.to_string(), c.value?.to_string())))
                .collect();
            (r.resource_name.to_string(), configs)
        })
        .collect())
}
