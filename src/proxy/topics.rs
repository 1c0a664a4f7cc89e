//! Resolving topic ids (Fetch and Produce v13+ name topics by id) to names,
//! without letting clients turn unknown ids into metadata storms.
//!
//! A client can pipeline requests with random topic ids. Each unknown id
//! used to cost a full metadata request, inline. Here lookups are
//! single-flight (at most one metadata request in flight; callers that
//! arrive meanwhile wait for it and then look again) and negatively cached
//! (an id still unknown after a refresh is not looked up again for `ttl`;
//! callers keep withholding its records). The cache is bounded: when full,
//! expired entries go first, then all of them.
//!
//! The same resolver serves broker node ids: under SNI routing a client
//! names a node in its TLS server name, and an unknown one must not cost a
//! metadata request per handshake either.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;

/// Most ids remembered as unknown at once.
const MAX_UNKNOWN: usize = 10_000;

/// Single-flight lookups of unknown topic ids.
pub type TopicResolver = Resolver<Uuid>;
/// Single-flight lookups of unknown broker node ids.
pub type NodeResolver = Resolver<i32>;

/// Single-flight lookups with a negative cache, of ids of type `K`.
#[derive(Debug)]
pub struct Resolver<K> {
    /// Held while a metadata request is in flight.
    in_flight: tokio::sync::Mutex<()>,
    /// Ids still unknown after a refresh, and when that refresh ended.
    unknown: Mutex<HashMap<K, Instant>>,
    ttl: Duration,
}

impl<K: Copy + Eq + Hash + Ord> Resolver<K> {
    pub fn new(ttl: Duration) -> Self {
        Resolver {
            in_flight: tokio::sync::Mutex::new(()),
            unknown: Mutex::new(HashMap::new()),
            ttl,
        }
    }

    /// Make sure every id of `ids` that `known` does not know has been
    /// looked up (by `refresh`, which learns names as a side effect) unless
    /// it was looked up recently and found missing.
    pub async fn resolve<Kn, F, Fut>(&self, ids: &[K], known: Kn, refresh: F)
    where
        Kn: Fn(&K) -> bool,
        F: FnOnce() -> Fut,
        Fut: Future<Output = ()>,
    {
        if self.wanted(ids, &known).is_empty() {
            return;
        }
        let _one_at_a_time = self.in_flight.lock().await;
        // A refresh that ended while we waited may have answered already.
        let wanted = self.wanted(ids, &known);
        if wanted.is_empty() {
            return;
        }
        refresh().await;
        let now = Instant::now();
        let mut unknown = self.lock_unknown();
        if unknown.len() + wanted.len() > MAX_UNKNOWN {
            unknown.retain(|_, at| now.duration_since(*at) < self.ttl);
            if unknown.len() + wanted.len() > MAX_UNKNOWN {
                unknown.clear();
            }
        }
        for id in wanted.into_iter().filter(|id| !known(id)) {
            unknown.insert(id, now);
        }
    }

    /// Ids neither known nor recently found missing (deduplicated).
    fn wanted<Kn: Fn(&K) -> bool>(&self, ids: &[K], known: &Kn) -> Vec<K> {
        let now = Instant::now();
        let unknown = self.lock_unknown();
        let mut out: Vec<K> = ids
            .iter()
            .filter(|id| !known(id))
            .filter(|id| {
                unknown
                    .get(id)
                    .is_none_or(|at| now.duration_since(*at) >= self.ttl)
            })
            .copied()
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    fn lock_unknown(&self) -> std::sync::MutexGuard<'_, HashMap<K, Instant>> {
        match self.unknown.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use dashmap::DashMap;

    /// A fake cluster: ids it knows, names learned by `refresh`, and a
    /// count of refreshes (at most one in flight is checked by `busy`).
    #[derive(Default)]
    struct Cluster {
        exists: Vec<Uuid>,
        learned: DashMap<Uuid, ()>,
        refreshes: AtomicUsize,
        busy: AtomicUsize,
    }

    impl Cluster {
        async fn refresh(&self) {
            assert_eq!(
                self.busy.fetch_add(1, Ordering::SeqCst),
                0,
                "two refreshes in flight"
            );
            self.refreshes.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            for id in &self.exists {
                self.learned.insert(*id, ());
            }
            self.busy.fetch_sub(1, Ordering::SeqCst);
        }
        async fn resolve(&self, r: &TopicResolver, ids: &[Uuid]) {
            r.resolve(ids, |id| self.learned.contains_key(id), || self.refresh())
                .await
        }
    }

    #[tokio::test]
    async fn concurrent_lookups_share_one_metadata_request() {
        let known = Uuid::from_u128(1);
        let cluster = Arc::new(Cluster {
            exists: vec![known],
            ..Default::default()
        });
        let r = Arc::new(TopicResolver::new(Duration::from_secs(60)));
        let tasks: Vec<_> = (0..20)
            .map(|_| {
                let (c, r) = (cluster.clone(), r.clone());
                tokio::spawn(async move { c.resolve(&r, &[known]).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(cluster.refreshes.load(Ordering::SeqCst), 1);
        assert!(cluster.learned.contains_key(&known));
        // Known now: no further lookups.
        cluster.resolve(&r, &[known]).await;
        assert_eq!(cluster.refreshes.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_id_still_unknown_after_a_refresh_is_not_looked_up_again_until_the_ttl() {
        let cluster = Cluster::default();
        let r = TopicResolver::new(Duration::from_millis(300));
        let random = Uuid::from_u128(99);
        for _ in 0..50 {
            cluster.resolve(&r, &[random]).await;
        }
        assert_eq!(cluster.refreshes.load(Ordering::SeqCst), 1);
        // A different unknown id costs one more lookup.
        cluster.resolve(&r, &[random, Uuid::from_u128(100)]).await;
        assert_eq!(cluster.refreshes.load(Ordering::SeqCst), 2);
        tokio::time::sleep(Duration::from_millis(350)).await;
        cluster.resolve(&r, &[random]).await;
        assert_eq!(cluster.refreshes.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn the_negative_cache_is_bounded() {
        let cluster = Cluster::default();
        let r = TopicResolver::new(Duration::from_secs(60));
        let ids: Vec<Uuid> = (0..(MAX_UNKNOWN as u128 + 10))
            .map(Uuid::from_u128)
            .collect();
        cluster.resolve(&r, &ids[..MAX_UNKNOWN]).await;
        assert_eq!(r.lock_unknown().len(), MAX_UNKNOWN);
        cluster.resolve(&r, &ids[MAX_UNKNOWN..]).await;
        assert!(r.lock_unknown().len() <= MAX_UNKNOWN);
    }

    /// SNI handshakes naming a node the cluster does not have: one
    /// metadata request for all of them, and none again within the TTL.
    #[tokio::test]
    async fn unknown_node_ids_cost_one_lookup_for_many_handshakes() {
        let refreshes = Arc::new(AtomicUsize::new(0));
        let r = Arc::new(NodeResolver::new(Duration::from_secs(60)));
        let lookup = |r: Arc<NodeResolver>, n: Arc<AtomicUsize>| async move {
            r.resolve(
                &[4242],
                |_| false,
                || async {
                    n.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(30)).await;
                },
            )
            .await
        };
        let tasks: Vec<_> = (0..50)
            .map(|_| tokio::spawn(lookup(r.clone(), refreshes.clone())))
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        lookup(r.clone(), refreshes.clone()).await;
        assert_eq!(refreshes.load(Ordering::SeqCst), 1);
    }
}
