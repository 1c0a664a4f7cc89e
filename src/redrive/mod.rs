//! Background work over the DLTs that `antidote run` starts beside the
//! proxy: following the blocked keys of per_key policies
//! ([`crate::deadletter::blocked`]) and re-driving records
//! (`dead_letter.redrive`, [`run`]).

use std::sync::Arc;

use crate::client::{Cluster, Endpoint};
use crate::config::Config;
use crate::deadletter::blocked::Follower;
use crate::filter::FetchFilter;

pub mod run;

/// Start the blocked-key follower, and the re-drive loop when configured.
pub fn start(config: &Config, filter: &Arc<FetchFilter>, upstream: &Endpoint, dlt: &Endpoint) {
    let upstream_bootstrap = config.upstream.bootstrap_servers.clone();
    let dlt_bootstrap = config
        .dead_letter
        .bootstrap_servers
        .clone()
        .unwrap_or_else(|| upstream_bootstrap.clone());
    let follower = Follower::new(
        filter.blocked.clone(),
        filter.breakers.clone(),
        Cluster::new(dlt_bootstrap.clone(), dlt.clone()),
        Cluster::new(upstream_bootstrap.clone(), upstream.clone()),
    );
    tokio::spawn(follower.run());
    if let Some(cfg) = config.dead_letter.redrive.clone() {
        let redrive = run::Loop::new(
            cfg,
            filter.clone(),
            Cluster::new(dlt_bootstrap, dlt.clone()),
            Cluster::new(upstream_bootstrap, upstream.clone()),
        );
        tokio::spawn(redrive.run());
    }
}
