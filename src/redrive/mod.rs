//! Background work over the DLTs that `antidote run` starts beside the
//! proxy: one DLT follower ([`follower`]) that keeps the blocked keys of
//! per_key policies and the breakers in step with the DLTs, and feeds the
//! re-drive scheduler (`dead_letter.redrive`, [`run`]).

use std::sync::Arc;

use crate::client::{Cluster, Endpoint};
use crate::config::Config;
use crate::deadletter::blocked::BlockedKeys;
use crate::deadletter::breaker::Breakers;
use crate::engine::Engine;

pub mod follower;
pub mod run;

pub use run::Scheduler;

/// The DLT follower (with the re-drive scheduler when configured), with
/// one client of the dead-letter cluster and one of the upstream; not
/// started ([`follower::Follower::run`]).
pub fn follower(
    config: &Config,
    engine: Arc<Engine>,
    keys: (Arc<BlockedKeys>, Arc<Breakers>),
    (upstream, dlt): (&Endpoint, &Endpoint),
) -> follower::Follower {
    let upstream_bootstrap = config.upstream.bootstrap_servers.clone();
    let dlt_bootstrap = config
        .dead_letter
        .bootstrap_servers
        .clone()
        .unwrap_or_else(|| upstream_bootstrap.clone());
    follower::Follower::new(
        engine,
        keys,
        config.dead_letter.redrive.clone().map(Scheduler::new),
        Cluster::new(dlt_bootstrap, dlt.clone()),
        Cluster::new(upstream_bootstrap, upstream.clone()),
    )
}
