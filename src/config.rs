//! The proxy's YAML configuration: its shape, its defaults, and errors that
//! name the file, line and column of the offending key.
//!
//! Unknown keys are errors (`deny_unknown_fields` everywhere): a misspelt key
//! silently ignored is a production incident waiting to happen. Values are
//! checked while deserializing, so a bad address or duration is reported at
//! its own position. Paths are resolved relative to the config file.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::Deserialize;

pub use admin::Admin;
pub use antidote_core::text::{parse_duration, yaml_error};
pub use limits::Limits;
pub use redrive::Redrive;
pub use registry::{BasicAuth, RegistryConfig, RegistryUrl};
pub use share::{
    RemovedAck, ShareGroups, DEFAULT_MAX_RENEWALS, DEFAULT_OWED_ACKS_BUDGET,
    DEFAULT_WITHHELD_BUDGET,
};
pub use signing::{SigningKey, UnsignedRecords};
pub use sni::{Sni, SniPattern};

mod admin;
mod limits;
mod redrive;
mod registry;
mod share;
mod signing;
mod sni;

/// A config file that could not be used; the message starts with `file:line:column`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub listen: Listen,
    pub upstream: Upstream,
    /// Policy files or directories.
    #[serde(default)]
    pub policies: Vec<PathBuf>,
    #[serde(default)]
    pub limits: Limits,
    /// Where diverted records are written; defaults to the upstream cluster.
    #[serde(default)]
    pub dead_letter: DeadLetterConfig,
    /// The admin HTTP listener (metrics and health).
    #[serde(default)]
    pub admin: Admin,
    /// What logs may contain.
    #[serde(default)]
    pub logging: Logging,
    /// Where `registry: true` policies resolve schema ids.
    #[serde(default)]
    pub schema_registry: Option<RegistryConfig>,
    /// Share consumers (KIP-932).
    #[serde(default)]
    pub share_groups: ShareGroups,
    /// Where this config was read from; paths in it are relative to its folder.
    #[serde(skip)]
    pub source: PathBuf,
}

/// Where clients connect. Checked as a whole (`RawListen::check`), so a
/// setting that needs another (`sni` needs `tls`) is reported at the
/// position of the `listen` section.
#[derive(Debug, Clone)]
pub struct Listen {
    /// What clients put in `bootstrap.servers`.
    pub bootstrap: HostPort,
    /// Host written into rewritten metadata (default: bootstrap's host).
    pub advertised_host: Option<String>,
    /// The broker with node id N is served at `broker_port_base + N`
    /// (unused with `sni`: every broker is then served on the bootstrap port).
    pub broker_port_base: u16,
    /// TLS towards clients; plaintext when absent.
    pub tls: Option<ServerTls>,
    /// Route by TLS server name on the bootstrap port instead of one port per broker.
    pub sni: Option<Sni>,
}

/// `listen` as written, before the checks that span its keys.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListen {
    bootstrap: HostPort,
    #[serde(default)]
    advertised_host: Option<String>,
    #[serde(default)]
    broker_port_base: Option<u16>,
    #[serde(default)]
    tls: Option<ServerTls>,
    #[serde(default)]
    sni: Option<Sni>,
}

impl RawListen {
    fn check(self) -> Result<Listen, String> {
        let base = match (&self.sni, self.broker_port_base) {
            (None, None) => {
                return Err("`broker_port_base` is required (unless `sni` is set)".into())
            }
            (None, Some(b)) => b,
            (Some(_), None) => 0,
            (Some(_), Some(_)) => {
                return Err(
                    "`broker_port_base` cannot be used with `sni`: every broker is \
                            served on the bootstrap port"
                        .into(),
                )
            }
        };
        if let Some(sni) = &self.sni {
            if self.tls.is_none() {
                return Err(
                    "`sni` requires `tls`: the server name is read from the TLS \
                            ClientHello"
                        .into(),
                );
            }
            if self.advertised_host.is_some() {
                return Err("`advertised_host` cannot be used with `sni`: brokers are \
                            advertised as `sni.broker` names"
                    .into());
            }
            if sni.broker.node(&sni.bootstrap).is_some() {
                return Err(format!(
                    "`sni.bootstrap` `{}` matches the `sni.broker` pattern",
                    sni.bootstrap
                ));
            }
        }
        Ok(Listen {
            bootstrap: self.bootstrap,
            advertised_host: self.advertised_host,
            broker_port_base: base,
            tls: self.tls,
            sni: self.sni,
        })
    }
}

impl<'de> Deserialize<'de> for Listen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Checking inside `visit_map` lets serde_yaml give the error the
        // position of the `listen` mapping (a check after deserializing
        // would carry no position at all).
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = Listen;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("the `listen` section")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Listen, A::Error> {
                let raw = RawListen::deserialize(de::value::MapAccessDeserializer::new(map))?;
                raw.check().map_err(de::Error::custom)
            }
        }
        d.deserialize_map(Visitor)
    }
}

impl Listen {
    pub fn advertised_host(&self) -> &str {
        self.advertised_host
            .as_deref()
            .unwrap_or(&self.bootstrap.host)
    }
}

/// The cluster the proxy fronts.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    pub bootstrap_servers: Vec<HostPort>,
    /// TLS towards brokers; plaintext when absent.
    #[serde(default)]
    pub tls: Option<ClientTls>,
    /// SASL for the proxy's own connections (clients authenticate themselves).
    #[serde(default)]
    pub sasl: Option<crate::sasl::SaslConfig>,
    #[serde(default = "default_connect_timeout", deserialize_with = "de_duration")]
    pub connect_timeout: Duration,
    /// How often broker metadata is refreshed in the background.
    #[serde(default = "default_metadata_refresh", deserialize_with = "de_duration")]
    pub metadata_refresh: Duration,
}

/// TLS served to clients.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// PEM CA bundle; when set, clients must present a certificate it signed (mTLS).
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
}

/// TLS used when connecting to brokers.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTls {
    /// PEM CA bundle that signed the brokers' certificates.
    pub ca: PathBuf,
    /// Optional client certificate and key (mTLS towards brokers).
    #[serde(default)]
    pub cert: Option<PathBuf>,
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// Name to verify the brokers' certificates against (default: the host connected to).
    #[serde(default)]
    pub server_name: Option<String>,
    /// Present `cert` on relayed client connections too. Off by default:
    /// otherwise every client would act with the proxy's own principal;
    /// client identity reaches brokers through SASL passthrough instead.
    #[serde(default)]
    pub relay_client_cert: bool,
}

/// The dead-letter producer's cluster and settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterConfig {
    /// Defaults to the upstream cluster.
    #[serde(default)]
    pub bootstrap_servers: Option<Vec<HostPort>>,
    #[serde(default)]
    pub tls: Option<ClientTls>,
    /// SASL for the dead-letter cluster.
    #[serde(default)]
    pub sasl: Option<crate::sasl::SaslConfig>,
    /// How long a Fetch response may wait for its diversions to be acknowledged.
    #[serde(default = "default_dlt_timeout", deserialize_with = "de_duration")]
    pub timeout: Duration,
    /// Partitions of a dead-letter topic the proxy creates.
    #[serde(default = "one_i32")]
    pub partitions: i32,
    /// Replication factor of a dead-letter topic the proxy creates; -1
    /// (the default): the cluster's `default.replication.factor`.
    #[serde(default = "broker_default")]
    pub replication_factor: i16,
    /// Relay client Produce requests to dead-letter topics. Off by default:
    /// whoever writes to a DLT can forge the `x-original-*` headers the
    /// once-only ledger is rebuilt from.
    #[serde(default)]
    pub allow_client_produce: bool,
    /// Codec of the batches written to dead-letter topics.
    #[serde(default)]
    pub compression: DltCompression,
    /// Re-validate records of some classes by themselves (optional).
    #[serde(default)]
    pub redrive: Option<Redrive>,
    /// Secrets that sign what antidote writes to DLTs and verify what it
    /// reads back (`config/signing.rs`); the first signs.
    #[serde(default)]
    pub signing_keys: Vec<SigningKey>,
    /// With keys: refuse (default) or accept records without a signature.
    #[serde(default)]
    pub unsigned_records: UnsignedRecords,
    /// `strict` (default): a DLT partition is written only under its
    /// producer lease; `best_effort`: without one when it cannot be had.
    #[serde(default)]
    pub fencing: Fencing,
}

/// `dead_letter.fencing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fencing {
    /// Writes wait (their partition is held) until the lease is had.
    #[default]
    Strict,
    /// Writes go on without fencing or idempotence while InitProducerId
    /// fails: a fleet may then write a record twice.
    BestEffort,
}

impl DeadLetterConfig {
    /// The signing keys, read from the environment and files.
    pub fn keys(&self) -> Result<antidote_core::dlt_context::Keys, String> {
        signing::keys(&self.signing_keys, self.unsigned_records)
    }
}

/// `dead_letter.compression`. gzip by default: it is the one codec every
/// Kafka client reads without an optional library (kafkajs ships only
/// gzip; kafka-python needs extra packages for snappy, lz4 and zstd), and
/// tansu and Kafka brokers accept it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DltCompression {
    None,
    #[default]
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl DltCompression {
    pub fn codec(self) -> crate::kafka::compression::Compression {
        use crate::kafka::compression::Compression;
        match self {
            DltCompression::None => Compression::None,
            DltCompression::Gzip => Compression::Gzip,
            DltCompression::Snappy => Compression::Snappy,
            DltCompression::Lz4 => Compression::Lz4,
            DltCompression::Zstd => Compression::Zstd,
        }
    }
}

impl Default for DeadLetterConfig {
    fn default() -> Self {
        DeadLetterConfig {
            bootstrap_servers: None,
            tls: None,
            sasl: None,
            timeout: default_dlt_timeout(),
            partitions: 1,
            replication_factor: -1,
            allow_client_produce: false,
            compression: DltCompression::default(),
            redrive: None,
            signing_keys: Vec::new(),
            unsigned_records: UnsignedRecords::default(),
            fencing: Fencing::default(),
        }
    }
}

/// What logs may contain.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Logging {
    /// Log the reasons of invalid records, which quote field values (record
    /// contents, possibly personal data). Off by default: logs then name
    /// the class, the rule and the offset only.
    #[serde(default)]
    pub record_contents: bool,
}

fn default_connect_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_metadata_refresh() -> Duration {
    Duration::from_secs(30)
}
fn default_dlt_timeout() -> Duration {
    Duration::from_secs(5)
}
fn one_i32() -> i32 {
    1
}
/// -1 in CreateTopics (v4+, KIP-464): the broker's default.
fn broker_default() -> i16 {
    -1
}

/// A `host:port` pair, checked when the config is read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    pub host: String,
    pub port: u16,
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl FromStr for HostPort {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| format!("`{s}` is not host:port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(format!("`{s}` has no host"));
        }
        let port = port
            .parse::<u16>()
            .map_err(|_| format!("`{s}`: `{port}` is not a port number"))?;
        Ok(HostPort {
            host: host.to_string(),
            port,
        })
    }
}

impl<'de> Deserialize<'de> for HostPort {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

/// serde helper: a duration written as text (`10s`) or a number of seconds.
pub fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Num(f64),
        Text(String),
    }
    match Raw::deserialize(d)? {
        Raw::Num(n) => parse_duration(&n.to_string()).map_err(de::Error::custom),
        Raw::Text(t) => parse_duration(&t).map_err(de::Error::custom),
    }
}

impl Config {
    /// Read and check a config file. Relative paths become relative to its folder.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("{}: {e}", path.display())))?;
        // `${VAR}` from the environment, before YAML sees the text (crate::envsubst).
        let text = crate::envsubst::expand_file_text(&text, path).map_err(ConfigError)?;
        Self::parse(&text, path)
    }

    /// Parse config text as if read from `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let mut cfg: Config =
            serde_yaml::from_str(text).map_err(|e| ConfigError(yaml_error(path, &e)))?;
        cfg.source = path.to_path_buf();
        let base = path.parent().unwrap_or(Path::new("."));
        cfg.resolve_paths(base);
        cfg.check()
            .map_err(|m| ConfigError(format!("{}: {m}", path.display())))?;
        Ok(cfg)
    }

    fn resolve_paths(&mut self, base: &Path) {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        self.policies.iter_mut().for_each(fix);
        self.admin.console_token_file.as_mut().map(fix);
        for k in &mut self.dead_letter.signing_keys {
            k.resolve(base);
        }
        if let Some(t) = &mut self.listen.tls {
            fix(&mut t.cert);
            fix(&mut t.key);
            t.client_ca.as_mut().map(fix);
        }
        let registry_tls = self.schema_registry.as_mut().and_then(|r| r.tls.as_mut());
        for t in [
            self.upstream.tls.as_mut(),
            self.dead_letter.tls.as_mut(),
            registry_tls,
        ]
        .into_iter()
        .flatten()
        {
            fix(&mut t.ca);
            t.cert.as_mut().map(fix);
            t.key.as_mut().map(fix);
        }
    }

    /// Checks that span several keys (each key's own shape is checked by serde).
    fn check(&self) -> Result<(), String> {
        if self.upstream.bootstrap_servers.is_empty() {
            return Err("upstream.bootstrap_servers: at least one broker is needed".into());
        }
        if let Some(r) = &self.schema_registry {
            r.check()?;
        }
        for (name, tls) in [
            ("upstream.tls", &self.upstream.tls),
            ("dead_letter.tls", &self.dead_letter.tls),
        ] {
            if let Some(t) = tls {
                if t.cert.is_some() != t.key.is_some() {
                    return Err(format!("{name}: `cert` and `key` must be given together"));
                }
            }
        }
        for (name, sasl) in [
            ("upstream.sasl", &self.upstream.sasl),
            ("dead_letter.sasl", &self.dead_letter.sasl),
        ] {
            if let Some(s) = sasl {
                s.password().map_err(|e| format!("{name}: {e}"))?;
            }
        }
        if self.admin.console_actions && !self.admin.console {
            return Err("admin.console_actions needs admin.console: true".into());
        }
        if self.admin.console_token()?.is_none() && self.admin.console_actions {
            return Err(
                "admin.console_actions needs a credential: admin.console_token_file or \
                 admin.console_token_env (the console sends it as `authorization: Bearer <token>`)"
                    .into(),
            );
        }
        if self.admin.console && self.admin.listen.is_none() {
            return Err("admin.console needs admin.listen (the console is served there)".into());
        }
        self.dead_letter.keys()?;
        if !matches!(self.dead_letter.replication_factor, -1 | 1..) {
            return Err(
                "dead_letter.replication_factor: -1 (the cluster's default) or at least 1".into(),
            );
        }
        if !(1..=10).contains(&self.share_groups.last_delivery) {
            return Err(
                "share_groups.last_delivery: must be from 1 to 10 (a group's \
                 share.delivery.count.limit is 2 to 10; 1: never withhold a valid record)"
                    .into(),
            );
        }
        if self.limits.max_frame_bytes < 1024 {
            return Err("limits.max_frame_bytes: must be at least 1024".into());
        }
        if self.limits.decode_budget < 1024 * 1024 {
            return Err("limits.decode_budget: must be at least 1048576 (1 MiB)".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "listen:\n  bootstrap: 127.0.0.1:29092\n  broker_port_base: 29100\nupstream:\n  bootstrap_servers: [127.0.0.1:9092]\n";

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::parse(MINIMAL, Path::new("/etc/antidote/a.yaml")).unwrap();
        assert_eq!(c.listen.advertised_host(), "127.0.0.1");
        assert_eq!(c.limits.max_frame_bytes, 100 * 1024 * 1024);
        assert_eq!(c.upstream.bootstrap_servers[0].port, 9092);
        assert_eq!(
            c.dead_letter.replication_factor, -1,
            "the cluster's default"
        );
    }

    #[test]
    fn unknown_key_names_file_line_and_column() {
        let text = format!("{MINIMAL}polices: [x]\n");
        let err = Config::parse(&text, Path::new("cfg.yaml")).unwrap_err().0;
        assert!(
            err.starts_with("cfg.yaml:6:1: unknown field `polices`"),
            "{err}"
        );
    }

    #[test]
    fn dead_letter_compression_is_gzip_by_default_and_checked() {
        let c = Config::parse(MINIMAL, Path::new("cfg.yaml")).unwrap();
        assert_eq!(c.dead_letter.compression, DltCompression::Gzip);
        let text = format!("{MINIMAL}dead_letter:\n  compression: lz4\n");
        let c = Config::parse(&text, Path::new("cfg.yaml")).unwrap();
        assert_eq!(c.dead_letter.compression, DltCompression::Lz4);
        let text = format!("{MINIMAL}dead_letter:\n  compression: brotli\n");
        let err = Config::parse(&text, Path::new("cfg.yaml")).unwrap_err().0;
        assert!(
            err.starts_with("cfg.yaml:7:16: dead_letter.compression: unknown variant `brotli`"),
            "{err}"
        );
    }

    #[test]
    fn bad_address_is_reported_at_its_position() {
        let text = MINIMAL.replace("127.0.0.1:9092", "localhost");
        let err = Config::parse(&text, Path::new("cfg.yaml")).unwrap_err().0;
        assert!(err.starts_with("cfg.yaml:5:"), "{err}");
        assert!(err.contains("not host:port"), "{err}");
    }

    #[test]
    fn relative_paths_follow_the_config_file() {
        let text = format!("{MINIMAL}policies: [policies/]\n");
        let c = Config::parse(&text, Path::new("/etc/antidote/a.yaml")).unwrap();
        assert_eq!(c.policies[0], PathBuf::from("/etc/antidote/policies/"));
    }

    #[test]
    fn the_console_needs_the_admin_listener_and_actions_the_console() {
        let parse =
            |admin: &str| Config::parse(&format!("{MINIMAL}admin:\n{admin}"), Path::new("c.yaml"));
        std::env::set_var("ANTIDOTE_TEST_CONSOLE_TOKEN", "0123456789abcdef-token");
        let with_token = "  console_token_env: ANTIDOTE_TEST_CONSOLE_TOKEN\n";
        let c = parse(&format!(
            "  listen: 9644\n  console: true\n  console_actions: true\n{with_token}"
        ))
        .unwrap();
        assert!(c.admin.console && c.admin.console_actions);
        assert_eq!(
            c.admin.console_token().unwrap().as_deref(),
            Some("0123456789abcdef-token")
        );
        let e = parse("  listen: 9644\n  console_actions: true\n")
            .unwrap_err()
            .0;
        assert_eq!(e, "c.yaml: admin.console_actions needs admin.console: true");
        // Actions without a credential: anyone reaching the port could run them.
        let e = parse("  listen: 9644\n  console: true\n  console_actions: true\n")
            .unwrap_err()
            .0;
        assert!(e.contains("needs a credential"), "{e}");
        std::env::set_var("ANTIDOTE_TEST_SHORT_TOKEN", "short");
        let e = parse("  listen: 9644\n  console: true\n  console_actions: true\n  console_token_env: ANTIDOTE_TEST_SHORT_TOKEN\n")
            .unwrap_err()
            .0;
        assert!(e.contains("at least 16"), "{e}");
        let e = parse("  console: true\n").unwrap_err().0;
        assert!(e.contains("admin.console needs admin.listen"), "{e}");
        assert!(!parse("  listen: 9644\n").unwrap().admin.console);
    }

    #[test]
    fn a_bare_admin_port_binds_loopback_only() {
        for v in ["9644", "\":9644\""] {
            let c = Config::parse(
                &format!("{MINIMAL}admin:\n  listen: {v}\n"),
                Path::new("c.yaml"),
            )
            .unwrap();
            assert_eq!(c.admin.listen.unwrap().to_string(), "127.0.0.1:9644");
        }
        let c = Config::parse(
            &format!("{MINIMAL}admin:\n  listen: 0.0.0.0:9644\n"),
            Path::new("c.yaml"),
        )
        .unwrap();
        assert_eq!(c.admin.listen.unwrap().host, "0.0.0.0");
    }

    #[test]
    fn connection_limits_have_defaults_and_bad_values_name_their_position() {
        let c = Config::parse(MINIMAL, Path::new("c.yaml")).unwrap();
        assert_eq!(c.limits.max_connections, 10_000);
        assert_eq!(c.limits.idle_timeout, Duration::from_secs(600));
        assert!(!c.dead_letter.allow_client_produce);
        assert_eq!(c.limits.fetch_max_version, None);
        assert!(c.limits.judge_ahead);
        assert_eq!(c.limits.judge_deadline, None);
        let text = format!(
            "{MINIMAL}limits:\n  max_connections: 3\n  idle_timeout: 2s\n  fetch_max_version: 15\n  judge_ahead: false\n  judge_deadline: 0.5ms\n"
        );
        let c = Config::parse(&text, Path::new("c.yaml")).unwrap();
        assert_eq!(c.limits.max_connections, 3);
        assert_eq!(c.limits.idle_timeout, Duration::from_secs(2));
        assert_eq!(c.limits.fetch_max_version, Some(15));
        assert!(!c.limits.judge_ahead);
        assert_eq!(c.limits.judge_deadline, Some(Duration::from_micros(500)));
        for (bad, line) in [
            ("  max_connections: 0\n", 7),
            ("  max_connections: -4\n", 7),
            ("  idle_timeout: 0s\n", 7),
            ("  idle_timeout: soon\n", 7),
            ("  fetch_max_version: 3\n", 7),
            ("  fetch_max_version: 99\n", 7),
            ("  fetch_max_version: latest\n", 7),
            ("  judge_ahead: sometimes\n", 7),
            ("  judge_deadline: soon\n", 7),
        ] {
            let text = format!("{MINIMAL}limits:\n{bad}");
            let err = Config::parse(&text, Path::new("c.yaml")).unwrap_err().0;
            assert!(err.starts_with(&format!("c.yaml:{line}:")), "{bad}: {err}");
        }
        let text = format!("{MINIMAL}dead_letter:\n  allow_client_produce: maybe\n");
        let err = Config::parse(&text, Path::new("c.yaml")).unwrap_err().0;
        assert!(err.starts_with("c.yaml:7:"), "{err}");
    }

    #[test]
    fn passwords_never_appear_in_debug_output() {
        let text = MINIMAL.replace(
            "  bootstrap_servers: [127.0.0.1:9092]\n",
            "  bootstrap_servers: [127.0.0.1:9092]\n  sasl: { mechanism: PLAIN, username: svc, password: hunter2-s3cret }\n",
        ) + "dead_letter:\n  sasl: { mechanism: SCRAM-SHA-512, username: dlt, password: other-s3cret }\n";
        let c = Config::parse(&text, Path::new("c.yaml")).unwrap();
        let printed = format!("{c:?} {c:#?}");
        assert!(!printed.contains("hunter2-s3cret"), "{printed}");
        assert!(!printed.contains("other-s3cret"), "{printed}");
        assert!(printed.contains("<redacted>"));
        // The secret itself is still there for the exchange.
        let sasl = c.upstream.sasl.as_ref().unwrap();
        assert_eq!(sasl.password().unwrap(), "hunter2-s3cret");
    }

    const SNI: &str = "listen:\n  bootstrap: 0.0.0.0:29092\n  tls: { cert: c.pem, key: k.pem }\n  sni:\n    bootstrap: bootstrap.kafka.test\n    broker: \"broker-{node}.kafka.test\"\nupstream:\n  bootstrap_servers: [127.0.0.1:9092]\n";

    #[test]
    fn sni_replaces_the_broker_port_base() {
        let c = Config::parse(SNI, Path::new("c.yaml")).unwrap();
        let sni = c.listen.sni.as_ref().unwrap();
        assert_eq!(sni.bootstrap, "bootstrap.kafka.test");
        assert_eq!(sni.broker.name(3), "broker-3.kafka.test");
    }

    #[test]
    fn sni_errors_name_file_line_and_column() {
        for (text, start, says) in [
            (
                SNI.replace("broker-{node}", "broker-x"),
                "c.yaml:6:13: listen.sni.broker: ",
                "no `{node}`",
            ),
            (
                SNI.replace("  tls: { cert: c.pem, key: k.pem }\n", ""),
                "c.yaml:2:3: listen: ",
                "`sni` requires `tls`",
            ),
            (
                SNI.replace("  sni:", "  broker_port_base: 29100\n  sni:"),
                "c.yaml:2:3: listen: ",
                "cannot be used with `sni`",
            ),
            (
                SNI.replace("bootstrap: bootstrap.", "bootstrap: broker-1."),
                "c.yaml:2:3: listen: ",
                "matches the `sni.broker` pattern",
            ),
            (
                SNI.replace("bootstrap: bootstrap.kafka.test", "bootstrap: 10.0.0.1"),
                "c.yaml:5:16: listen.sni.bootstrap: ",
                "not a DNS host name",
            ),
            (
                MINIMAL.replace("  broker_port_base: 29100\n", ""),
                "c.yaml:2:3: listen: ",
                "`broker_port_base` is required",
            ),
        ] {
            let err = Config::parse(&text, Path::new("c.yaml")).unwrap_err().0;
            assert!(err.starts_with(start) && err.contains(says), "{err}");
        }
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
        assert!(parse_duration("5 parsecs").is_err());
    }
}
