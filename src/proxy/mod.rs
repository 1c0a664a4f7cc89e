//! The network hop: listeners, per-connection relay, address rewriting, API
//! version negotiation and TLS.
//!
//! One listener serves the bootstrap address; one more serves each upstream
//! broker, at `broker_port_base + node id`, opened as brokers appear in
//! metadata (the proxy's own lookups or any Metadata-like response relayed
//! to a client). The mapping is deterministic, so a restarted proxy hands
//! out the same ports. With `listen.sni` there is only the bootstrap
//! listener: a TLS connection picks its broker by server name, read from
//! the ClientHello before the handshake completes. Each accepted connection
//! gets its own upstream connection and a `relay`.

mod accept;
pub mod addresses;
mod classify;
mod error;
mod exchange;
pub mod limits;
pub mod relay;
pub mod reload;
mod sasl_phase;
pub mod topics;
mod upstream;
pub mod versions;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use kafka_protocol::messages::{FetchResponse, MetadataRequest};
use kafka_protocol::protocol::StrBytes;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};
use uuid::Uuid;

use crate::admin;
use crate::client::{self, Connection};
use crate::config::{Config, HostPort};
use crate::dlt::blocked::BlockedKeys;
use crate::dlt::breaker::Breakers;
use crate::dlt::DeadLetter;
use crate::engine::Engine;
use crate::intercept::fetch::{FetchContext, FetchFilter};
use crate::metrics;
use crate::policy::PolicySet;
use crate::transport::tls;
use accept::accept_loop;
pub use addresses::Target;
use addresses::{Addresses, Seen};

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("TLS: {0}")]
    Tls(#[from] tls::TlsError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Admin(admin::AdminError),
    #[error("schema registry: {0}")]
    Registry(#[from] crate::registry::RegistryError),
}

/// State shared by every listener and connection.
pub struct Shared {
    pub config: Config,
    /// The API versions the proxy offers (its config's, read once).
    pub offer: versions::Offer,
    pub addrs: Addresses,
    /// TLS towards clients; its certificate is reloaded by `reload`.
    tls: Option<tls::Server>,
    /// Connections refused for their server name (`listen.sni`).
    sni_refusals: addresses::Refusals,
    pub upstream: client::Endpoint,
    /// TLS for relayed client connections (no client certificate unless
    /// `upstream.tls.relay_client_cert`); the proxy's own connections use
    /// `upstream`.
    relay_tls: Option<tls::Upstream>,
    /// Node id -> the broker's real address.
    pub brokers: DashMap<i32, HostPort>,
    /// Topic id -> name, for Fetch v13+ (which names topics by id).
    pub topic_names: DashMap<Uuid, StrBytes>,
    /// Name -> the id Metadata last gave it: a topic deleted and created
    /// again gets a new id, and the old one is forgotten (`learn`).
    topic_ids: DashMap<StrBytes, Uuid>,
    listening: tokio::sync::Mutex<HashSet<i32>>,
    /// Brokers whose listener could not be opened (not ready while any).
    unserved: addresses::Unserved,
    pub shutdown: CancellationToken,
    pub tasks: TaskTracker,
    /// Set once upstream metadata has been fetched.
    pub ready: AtomicBool,
    /// Policies, verdicts, decode budget and registry: what the two
    /// handlers below (Fetch interception, the Produce door) judge with.
    pub engine: Arc<Engine>,
    /// Fetch interception (idle while no policy is loaded).
    pub fetch_filter: Arc<FetchFilter>,
    /// Acknowledgements owed to share sessions for records removed from
    /// their ShareFetch responses (`intercept::share`).
    pub share_acks: crate::intercept::share::ShareAcks,
    /// The dead-letter side: the DLT writer and its ledger, and the keys
    /// parked behind diverted records (readiness asks them directly).
    dead_letter: Arc<DeadLetter>,
    blocked: Arc<crate::dlt::blocked::BlockedKeys>,
    /// The DLT console on the admin listener (`admin.console`).
    console: Option<Arc<crate::console::Console>>,
    /// Client connections served at once (`limits.max_connections`).
    pub connections: limits::ConnectionLimit,
    /// Request bytes being received and handled across connections
    /// (`limits.max_queued_request_bytes`).
    pub request_queue: crate::transport::frame::RequestQueue,
    /// Single-flight, negatively cached lookups of unknown topic ids.
    topic_resolver: topics::TopicResolver,
    /// The same for broker node ids a client names (SNI server names).
    node_resolver: topics::NodeResolver,
    /// Which bootstrap server is tried first.
    bootstrap_order: upstream::BootstrapOrder,
}

/// Where clients reach each broker: one port per broker, or SNI names on
/// the bootstrap port.
fn addresses_of(config: &Config) -> Addresses {
    match &config.listen.sni {
        Some(sni) => Addresses::sni(sni, config.listen.bootstrap.port),
        None => Addresses::new(
            config.listen.advertised_host(),
            config.listen.broker_port_base,
        ),
    }
}

/// The Fetch and ShareFetch filter over `engine`, writing to `dead_letter`.
fn fetch_filter(
    config: &Config,
    engine: &Arc<Engine>,
    dead_letter: &Arc<DeadLetter>,
    keys: &(Arc<BlockedKeys>, Arc<Breakers>),
) -> Arc<FetchFilter> {
    let filter = FetchFilter::new(
        engine.clone(),
        dead_letter.clone(),
        keys.clone(),
        config.dead_letter.timeout,
    );
    Arc::new(
        filter
            .with_judge_ahead(config.limits.judge_ahead)
            .with_judge_deadline(config.limits.judge_deadline),
    )
}

impl Shared {
    /// Build the shared state and the background tasks it needs (the DLT
    /// writer's producer and ledger loader, the DLT follower), none
    /// started: [`start`] wires and starts them.
    fn new(config: Config, policies: PolicySet) -> Result<(Arc<Shared>, Background), StartError> {
        let tls = config.listen.tls.as_ref().map(tls::server).transpose()?;
        let addrs = addresses_of(&config);
        let upstream = client::Endpoint::upstream(&config)?;
        let relay_tls = config
            .upstream
            .tls
            .as_ref()
            .map(tls::relay_connector)
            .transpose()?;
        let dlt = &config.dead_letter;
        let dlt_endpoint = client::Endpoint::dead_letter(&config)?;
        let policies = Arc::new(policies);
        let (dead_letter, dead_letter_workers) = DeadLetter::new(
            dlt,
            &config.upstream.bootstrap_servers,
            upstream.clone(),
            dlt_endpoint.clone(),
            policies.clone(),
        );
        let registry = config
            .schema_registry
            .as_ref()
            .map(|r| crate::registry::Registry::new(r, crate::policy::SchemaCache::shared()))
            .transpose()?;
        let engine = Engine::new(policies, config.limits.decode_budget, registry);
        let keys = (
            Arc::new(BlockedKeys::default()),
            Arc::new(Breakers::default()),
        );
        let fetch_filter = fetch_filter(&config, &engine, &dead_letter, &keys);
        let readers = crate::dlt::follower::KeyReaders::of(&config, keys.clone());
        let console =
            crate::console::Console::new(&config, engine.clone(), keys.1.clone(), keys.0.clone());
        let config_max_connections = config.limits.max_connections;
        let share_acks = crate::intercept::share::ShareAcks::of(&config.share_groups);
        let request_queue =
            crate::transport::frame::RequestQueue::new(config.limits.max_queued_request_bytes);
        // The background refresh learns new topics at this pace anyway.
        let negative_ttl = config.upstream.metadata_refresh;
        let shared = Arc::new(Shared {
            offer: versions::Offer::of(&config),
            config,
            addrs,
            tls,
            sni_refusals: addresses::Refusals::default(),
            upstream,
            relay_tls,
            brokers: DashMap::new(),
            topic_names: DashMap::new(),
            topic_ids: DashMap::new(),
            listening: tokio::sync::Mutex::new(HashSet::new()),
            unserved: addresses::Unserved::default(),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            ready: AtomicBool::new(false),
            engine,
            dead_letter,
            blocked: keys.0,
            console,
            fetch_filter,
            share_acks,
            connections: limits::ConnectionLimit::new(config_max_connections),
            request_queue,
            topic_resolver: topics::TopicResolver::new(negative_ttl),
            node_resolver: topics::NodeResolver::new(upstream::NODE_NEGATIVE_TTL),
            bootstrap_order: upstream::BootstrapOrder::default(),
        });
        let background = Background {
            dead_letter: dead_letter_workers,
            readers,
        };
        Ok((shared, background))
    }

    /// Learn the names of `ids` not known yet: at most one metadata request
    /// in flight (others wait for it), and an id still unknown after one is
    /// not looked up again for `upstream.metadata_refresh` (`topics`).
    pub async fn resolve_topic_ids(self: &Arc<Self>, ids: &[Uuid]) {
        self.topic_resolver
            .resolve(
                ids,
                |id| self.topic_names.contains_key(id),
                || async {
                    if let Err(e) = refresh_metadata(self).await {
                        metrics::global().upstream_error("metadata");
                        warn!(error = %e, "looking up unknown topic ids failed");
                    }
                },
            )
            .await
    }

    /// Record what a response revealed; open listeners for new brokers.
    pub async fn learn(self: &Arc<Self>, seen: Seen) {
        for (id, name) in seen.topics {
            // A deleted topic's id no longer names it: records still
            // answered under it (none should be) are withheld as unknown,
            // and nothing judged under the old id reaches the ledger.
            if let Some(old) = self.topic_ids.insert(name.clone(), id) {
                if old != id {
                    self.topic_names.remove(&old);
                }
            }
            self.topic_names.insert(id, name);
        }
        for (node, addr) in seen.brokers {
            let changed = self.brokers.insert(node, addr.clone()).as_ref() != Some(&addr);
            if changed {
                info!(node, %addr, "broker address learned");
            }
            self.ensure_listener(node).await;
        }
    }

    /// Open the listener for broker `node` unless it is already open.
    async fn ensure_listener(self: &Arc<Self>, node: i32) {
        let mut open = self.listening.lock().await;
        // Under SNI every broker is served on the bootstrap listener.
        if self.addrs.is_sni() || open.contains(&node) || self.shutdown.is_cancelled() {
            return;
        }
        let Some(port) = self.addrs.port_for(node) else {
            self.unserved.set(node, true);
            warn!(
                node,
                base = self.addrs.port_base,
                "broker node id does not map to a port; it cannot be served (not ready)"
            );
            return;
        };
        let host = &self.config.listen.bootstrap.host;
        match TcpListener::bind((host.as_str(), port)).await {
            Ok(listener) => {
                open.insert(node);
                self.unserved.set(node, false);
                info!(node, addr = %format!("{host}:{port}"), "serving broker");
                self.tasks
                    .spawn(accept_loop(self.clone(), listener, Target::Broker(node)));
            }
            Err(e) => {
                self.unserved.set(node, true);
                warn!(
                    node,
                    port,
                    error = %e,
                    "cannot open the listener for broker; clients sent to this port reach \
                     whatever holds it (not ready until it opens; retried on each metadata \
                     response)"
                )
            }
        }
    }
}

impl admin::Readiness for Shared {
    /// Upstream metadata fetched, a listener open for every broker it named,
    /// every known DLT read into the ledger, and the blocked keys of
    /// `ordering: per_key` policies read back (at once when no policy asks
    /// for per-key ordering).
    fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
            && self.unserved.is_empty()
            && self.dead_letter.is_ready()
            && self.blocked.is_loaded()
    }
}

/// The tasks [`Shared::new`] builds and [`start`] starts.
struct Background {
    dead_letter: crate::dlt::Workers,
    readers: crate::dlt::follower::KeyReaders,
}

/// Run the proxy until SIGINT or SIGTERM, then close the listeners, let
/// in-flight responses finish (bounded by `limits.shutdown_grace`) and return.
pub async fn run(
    config: Config,
    policies: PolicySet,
    loaded: reload::Stamp,
) -> Result<(), StartError> {
    let shared = start(config, policies, loaded).await?;
    wait_for_signal().await;
    stop(&shared).await;
    Ok(())
}

/// Bind the bootstrap listener and start serving; returns at once.
/// `loaded`: the policy files as they were before `policies` were read
/// (`reload::fingerprint`).
pub async fn start(
    config: Config,
    policies: PolicySet,
    loaded: reload::Stamp,
) -> Result<Arc<Shared>, StartError> {
    let (shared, background) = Shared::new(config, policies)?;
    background.dead_letter.spawn(Some(background.readers));
    let bootstrap = shared.config.listen.bootstrap.to_string();
    let listener = TcpListener::bind(&bootstrap)
        .await
        .map_err(|source| StartError::Bind {
            addr: bootstrap.clone(),
            source,
        })?;
    info!(addr = %bootstrap, "serving bootstrap");
    if let Some(w) = limits::fd_limit_warning(shared.config.limits.max_connections) {
        warn!("{w}");
    }
    if let Some(addr) = &shared.config.admin.listen {
        let admin = admin::bind(addr).await.map_err(StartError::Admin)?;
        shared.tasks.spawn(admin::serve_listener(
            admin,
            metrics::global().clone(),
            shared.clone(),
            shared.console.clone(),
            shared.shutdown.clone(),
        ));
    }
    shared
        .tasks
        .spawn(accept_loop(shared.clone(), listener, Target::Bootstrap));
    shared.tasks.spawn(metadata_loop(shared.clone()));
    tokio::spawn(reload::watch(shared.clone(), loaded));
    Ok(shared)
}

/// Close the listeners and wait (bounded) for in-flight responses.
pub async fn stop(shared: &Shared) {
    info!("shutting down: listeners closed, finishing in-flight responses");
    shared.shutdown.cancel();
    shared.tasks.close();
    let grace = shared.config.limits.shutdown_grace;
    if tokio::time::timeout(grace, shared.tasks.wait())
        .await
        .is_err()
    {
        warn!(?grace, "shutdown grace elapsed with connections still open");
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Fetch cluster metadata now and then every `upstream.metadata_refresh`,
/// retrying quickly until the first success.
async fn metadata_loop(shared: Arc<Shared>) {
    let mut delay = std::time::Duration::from_millis(200);
    loop {
        match refresh_metadata(&shared).await {
            Ok(()) => {
                if !shared.ready.swap(true, Ordering::SeqCst) {
                    info!(
                        brokers = shared.brokers.len(),
                        "upstream metadata fetched; ready"
                    );
                }
                delay = shared.config.upstream.metadata_refresh;
            }
            Err(e) => {
                metrics::global().upstream_error("metadata");
                warn!(error = %e, "fetching upstream metadata failed");
                delay = (delay * 2).min(std::time::Duration::from_secs(5));
            }
        }
        tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// Ask a bootstrap server for the brokers and topics; learn them.
pub async fn refresh_metadata(shared: &Arc<Shared>) -> Result<(), client::ClientError> {
    let servers = &shared.config.upstream.bootstrap_servers;
    let (used, mut conn) = connect_any(shared, servers).await?;
    let resp = conn
        .send(MetadataRequest::default().with_topics(None), 1, 12)
        .await
        .inspect_err(|e| pass_over(shared, servers, used, e))?;
    let mut seen = Seen::default();
    for b in &resp.brokers {
        if let Ok(port) = u16::try_from(b.port) {
            seen.brokers.push((
                b.node_id.0,
                HostPort {
                    host: b.host.to_string(),
                    port,
                },
            ));
        }
    }
    for t in &resp.topics {
        if let Some(name) = &t.name {
            if !t.topic_id.is_nil() {
                seen.topics.push((t.topic_id, name.0.clone()));
            }
        }
    }
    shared.learn(seen).await;
    Ok(())
}

/// The first of `servers` (in `bootstrap_order`) that accepts a
/// connection, and its index.
async fn connect_any(
    shared: &Shared,
    servers: &[HostPort],
) -> Result<(usize, Connection), client::ClientError> {
    let mut last = None;
    for i in shared.bootstrap_order.order(servers.len()) {
        match Connection::connect(&servers[i], &shared.upstream).await {
            Ok(c) => return Ok((i, c)),
            Err(e) => {
                // Refused or silent: clients' bootstrap connections, which
                // cannot tell, go to the next server first from now on.
                pass_over(shared, servers, i, &e);
                last = Some(e)
            }
        }
    }
    Err(last.unwrap_or_else(|| client::ClientError::Protocol {
        addr: HostPort {
            host: "-".into(),
            port: 0,
        },
        msg: "no bootstrap servers configured".into(),
    }))
}

/// Server `i` of `servers` failed a request: the next one comes first
/// for clients' bootstrap connections, which is said once per move.
fn pass_over(shared: &Shared, servers: &[HostPort], i: usize, error: &client::ClientError) {
    if shared.bootstrap_order.failed(i, servers.len()) {
        warn!(server = %servers[i], %error,
            "upstream bootstrap server failed: clients' bootstrap connections go to the next one first");
    }
}

/// The Fetch filter's view of the proxy: addresses and topic names.
impl FetchContext for Arc<Shared> {
    type Learned = Seen;

    fn rewrite_endpoints(&self, resp: &mut FetchResponse) -> (bool, Seen) {
        let mut seen = Seen::default();
        let changed = addresses::rewrite_fetch_endpoints(resp, &self.addrs, &mut seen);
        (changed, seen)
    }

    fn rewrite_share_endpoints(
        &self,
        resp: &mut kafka_protocol::messages::ShareFetchResponse,
    ) -> (bool, Seen) {
        let mut seen = Seen::default();
        let changed = addresses::rewrite_share_fetch_endpoints(resp, &self.addrs, &mut seen);
        (changed, seen)
    }

    async fn learn(&self, seen: Seen) {
        Shared::learn(self, seen).await
    }

    async fn resolve_topic_ids(&self, ids: &[Uuid]) {
        Shared::resolve_topic_ids(self, ids).await
    }

    fn topic_name(&self, id: &Uuid) -> Option<String> {
        self.topic_names.get(id).map(|n| n.to_string())
    }
}
