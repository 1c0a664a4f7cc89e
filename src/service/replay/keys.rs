//! `dlt replay` of blocked keys (`ordering: per_key`): a key's parked
//! records are replayed together, in origin order, or not at all.
//!
//! A selected record of a per_key topic with a key stands for its whole
//! group: every record of the same origin topic, partition and key in this
//! DLT that no release or discard marker covers yet. The group is judged
//! first; if any record of it would not be replayed (still invalid,
//! refused), none is, and the key stays blocked. Otherwise the records are
//! written in origin-offset order, the last one written carrying
//! `x-released-through: <highest origin offset of the group>` (the proxy
//! releases the key as it delivers that record), and once all are written a
//! release marker goes to the DLT (for restarts and other instances).

use crate::dlt::trust::Reader;
use std::collections::{HashMap, HashSet};

use bytes::Bytes;

use crate::client::Cluster;
use crate::dlt_marker::Marker;
use crate::policy::{KeyOrdering, PolicySet};
use crate::service::{read_dlt, DltError, DltRecord};

/// (origin topic, origin partition, key).
pub type GroupKey = (String, i32, Bytes);

/// What a replay run works through, in DLT order.
pub enum Unit {
    One(Box<DltRecord>),
    /// A blocked key's unreleased records, in origin-offset order.
    Key(GroupKey, Vec<DltRecord>),
}

/// The group `r` belongs to, if its origin topic orders per key.
pub fn group_of(policies: &PolicySet, r: &DltRecord) -> Option<GroupKey> {
    let topic = r.origin_topic.as_ref()?;
    let policy = policies.policing(topic)?;
    if policy.ordering != KeyOrdering::PerKey {
        return None;
    }
    Some((topic.clone(), r.origin_partition?, r.key.clone()?))
}

/// How far each key of `topic` is released, from its release/discard markers.
pub async fn released(
    cluster: &mut Cluster,
    topic: &str,
) -> Result<HashMap<GroupKey, i64>, DltError> {
    let mut out: HashMap<GroupKey, i64> = HashMap::new();
    crate::dlt::read_topic(cluster, topic, |p, r| {
        let Some(ctx) = crate::dlt::trust::open(Reader::Replay, topic, p, r) else {
            return;
        };
        if let Some(Marker::Release(m)) = Marker::parse(&ctx, r.key) {
            let t = out
                .entry((m.topic, m.partition, m.key))
                .or_insert(m.through);
            *t = (*t).max(m.through);
        }
    })
    .await?;
    Ok(out)
}

/// Turn the selected records into units: a selected record of an
/// unreleased blocked key brings its whole group.
pub async fn units(
    cluster: &mut Cluster,
    topic: &str,
    policies: &PolicySet,
    selected: Vec<DltRecord>,
) -> Result<Vec<Unit>, DltError> {
    let wanted: HashSet<GroupKey> = selected
        .iter()
        .filter_map(|r| group_of(policies, r))
        .collect();
    if wanted.is_empty() {
        return Ok(selected
            .into_iter()
            .map(|r| Unit::One(Box::new(r)))
            .collect());
    }
    let released = released(cluster, topic).await?;
    let open = |g: &GroupKey, r: &DltRecord| {
        r.origin_offset
            .is_some_and(|o| released.get(g).is_none_or(|t| o > *t))
    };
    let members = read_dlt(Reader::Replay, cluster, topic, |r| {
        group_of(policies, r).is_some_and(|g| wanted.contains(&g) && open(&g, r))
    })
    .await?;
    let mut groups: HashMap<GroupKey, Vec<DltRecord>> = HashMap::new();
    for r in members {
        if let Some(g) = group_of(policies, &r) {
            groups.entry(g).or_default().push(r);
        }
    }
    let mut out = Vec::new();
    for r in selected {
        match group_of(policies, &r).filter(|g| open(g, &r)) {
            Some(g) => {
                if let Some(mut rs) = groups.remove(&g) {
                    rs.sort_by_key(|r| r.origin_offset);
                    out.push(Unit::Key(g, rs));
                }
            }
            None => out.push(Unit::One(Box::new(r))),
        }
    }
    Ok(out)
}

/// Write a release (or discard) marker for `g` through `through` to the
/// DLT partition the group's records went to.
pub async fn write_marker(
    cluster: &mut Cluster,
    dlt: &str,
    g: &GroupKey,
    through: i64,
    discard: bool,
) -> Result<(), DltError> {
    let n = cluster
        .partitions(dlt)
        .await?
        .filter(|n| *n > 0)
        .ok_or_else(|| DltError::Usage(format!("dead-letter topic {dlt} does not exist")))?;
    let marker = Marker::Release(crate::dlt_marker::Release {
        topic: g.0.clone(),
        partition: g.1,
        key: g.2.clone(),
        through,
        discard,
    });
    let partition = g.1.rem_euclid(n as i32);
    let record = marker.to_record(
        crate::clock::now_ms(),
        &crate::dlt::trust::seal(dlt, partition),
    );
    crate::dlt::write::produce_plain(cluster, dlt, partition, &record).await?;
    Ok(())
}
