//! `schema_registry`: where `registry: true` policies resolve schema ids.
//! One URL or a list (tried in order), optional basic auth (the password
//! from the environment or the file, never printed), optional TLS, a
//! timeout per request and how long subject lists and "no such id"
//! answers are trusted. A malformed URL is reported at its own
//! file:line:column.

use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use super::{de_duration, ClientTls};
use crate::sasl::Secret;

/// `schema_registry` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    /// One URL or a list; each request tries them in order.
    #[serde(deserialize_with = "de_urls")]
    pub url: Vec<RegistryUrl>,
    #[serde(default)]
    pub basic_auth: Option<BasicAuth>,
    /// TLS for `https://` URLs (CA bundle, optional client certificate).
    #[serde(default)]
    pub tls: Option<ClientTls>,
    /// How long one request may take (connect included) before the next
    /// URL is tried; a record waits at most about this long per fetch.
    #[serde(default = "default_timeout", deserialize_with = "de_duration")]
    pub timeout: Duration,
    /// How long a subject list or a "no such id" answer is trusted.
    #[serde(default = "default_ttl", deserialize_with = "de_duration")]
    pub cache_ttl: Duration,
    /// Apicurio's native API (`.../apis/registry/v3`), for values framed
    /// Apicurio's way (`wire: apicurio-headers`, `apicurio-8byte`,
    /// `apicurio-4byte`). Default:
    /// each `url` ending in `/apis/ccompat/v7` (or `v6`) with that part
    /// replaced. Same auth, TLS and timeout as `url`.
    #[serde(default, deserialize_with = "de_some_urls")]
    pub apicurio_url: Option<Vec<RegistryUrl>>,
}

fn de_some_urls<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<RegistryUrl>>, D::Error> {
    de_urls(d).map(Some)
}

impl RegistryConfig {
    /// The URLs of Apicurio's native API: `apicurio_url`, or those derived
    /// from `url` (its ccompat paths).
    pub fn apicurio_urls(&self) -> Vec<RegistryUrl> {
        if let Some(list) = &self.apicurio_url {
            return list.clone();
        }
        (self.url.iter())
            .filter_map(|u| {
                let root = (u.base.strip_suffix("/apis/ccompat/v7"))
                    .or_else(|| u.base.strip_suffix("/apis/ccompat/v6"))?;
                Some(RegistryUrl {
                    base: format!("{root}/apis/registry/v3"),
                    ..u.clone()
                })
            })
            .collect()
    }
}

fn default_timeout() -> Duration {
    Duration::from_secs(5)
}

fn default_ttl() -> Duration {
    Duration::from_secs(60)
}

/// `schema_registry.basic_auth`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    pub username: String,
    #[serde(default)]
    pub password: Option<Secret>,
    /// Name of an environment variable holding the password.
    #[serde(default)]
    pub password_env: Option<String>,
}

impl BasicAuth {
    /// The password, from the config or the named environment variable.
    pub fn password(&self) -> Result<String, String> {
        match (&self.password, &self.password_env) {
            (Some(p), _) => Ok(p.expose().to_string()),
            (None, Some(var)) => {
                std::env::var(var).map_err(|_| format!("environment variable {var} is not set"))
            }
            (None, None) => Err("`password` or `password_env` is required".into()),
        }
    }
}

/// One registry URL: `http://host:port[/base]` or `https://...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryUrl {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// The path prefix, without a trailing `/` (often empty).
    pub base: String,
}

impl std::fmt::Display for RegistryUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}:{}{}", self.host, self.port, self.base)
    }
}

impl std::str::FromStr for RegistryUrl {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (tls, rest) = if let Some(r) = s.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = s.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(format!(
                "`{s}`: a registry URL starts with http:// or https://"
            ));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return Err(format!(
                "`{s}`: put credentials in basic_auth, not in the URL"
            ));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
                let port = p
                    .parse::<u16>()
                    .map_err(|_| format!("`{s}`: `{p}` is not a port number"))?;
                (h, port)
            }
            _ => (authority, if tls { 443 } else { 80 }),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || host.contains(|c: char| c.is_whitespace()) {
            return Err(format!("`{s}` has no valid host"));
        }
        if path.contains(['?', '#', ' ']) {
            return Err(format!(
                "`{s}`: no query, fragment or spaces in a registry URL"
            ));
        }
        Ok(RegistryUrl {
            tls,
            host: host.to_string(),
            port,
            base: path.trim_end_matches('/').to_string(),
        })
    }
}

fn de_urls<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<RegistryUrl>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        One(String),
        Many(Vec<String>),
    }
    let list = match Raw::deserialize(d)? {
        Raw::One(s) => vec![s],
        Raw::Many(v) => v,
    };
    if list.is_empty() {
        return Err(de::Error::custom("at least one registry URL is needed"));
    }
    list.iter()
        .map(|s| s.parse().map_err(de::Error::custom))
        .collect()
}

impl RegistryConfig {
    /// Checks across keys (each key's own shape is checked by serde).
    pub(super) fn check(&self) -> Result<(), String> {
        if let Some(a) = &self.basic_auth {
            a.password()
                .map_err(|e| format!("schema_registry.basic_auth: {e}"))?;
        }
        if let Some(t) = &self.tls {
            if t.cert.is_some() != t.key.is_some() {
                return Err("schema_registry.tls: `cert` and `key` must be given together".into());
            }
        }
        if self.url.iter().any(|u| u.tls) && self.tls.is_none() {
            return Err("schema_registry.tls: an https:// URL needs `tls` (at least `ca`)".into());
        }
        if self.timeout.is_zero() {
            return Err("schema_registry.timeout: must be longer than 0s".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::path::Path;

    const MINIMAL: &str = "listen:\n  bootstrap: 127.0.0.1:29092\n  broker_port_base: 29100\nupstream:\n  bootstrap_servers: [127.0.0.1:9092]\n";

    fn parse(extra: &str) -> Result<Config, String> {
        Config::parse(&format!("{MINIMAL}{extra}"), Path::new("/etc/a.yaml")).map_err(|e| e.0)
    }

    #[test]
    fn schema_registry_is_parsed_with_defaults_and_errors_name_line_and_column() {
        let c = parse("schema_registry:\n  url: http://127.0.0.1:8081\n").expect("parses");
        let r = c.schema_registry.expect("set");
        assert_eq!(
            (r.url.len(), r.timeout, r.cache_ttl),
            (1, Duration::from_secs(5), Duration::from_secs(60))
        );
        let e = parse("schema_registry:\n  url: [http://a:1, \"ftp://b\"]\n").expect_err("bad url");
        assert!(
            e.starts_with("/etc/a.yaml:7:") && e.contains("http://"),
            "{e}"
        );
        let e = parse("schema_registry:\n  url: http://a:1\n  timeuot: 1s\n").expect_err("typo");
        assert!(e.starts_with("/etc/a.yaml:8:3"), "{e}");
        // Untagged values (durations, URL lists) are placed at their section.
        let e =
            parse("schema_registry:\n  url: http://a:1\n  timeout: soon\n").expect_err("duration");
        assert!(e.starts_with("/etc/a.yaml:7:") && e.contains("soon"), "{e}");
        let e = parse("schema_registry:\n  url: https://a:1\n").expect_err("https without tls");
        assert!(e.contains("schema_registry.tls"), "{e}");
        let e = parse("schema_registry:\n  url: http://a:1\n  basic_auth: { username: u, password_env: NO_SUCH_VAR_SR }\n")
            .expect_err("unset password variable");
        assert!(e.contains("NO_SUCH_VAR_SR"), "{e}");
        let c = parse("schema_registry:\n  url: http://a:1\n  basic_auth: { username: u, password: hunter2 }\n").expect("ok");
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn urls() {
        let u: RegistryUrl = "http://127.0.0.1:8081".parse().expect("url");
        assert_eq!(
            (u.tls, u.host.as_str(), u.port, u.base.as_str()),
            (false, "127.0.0.1", 8081, "")
        );
        let u: RegistryUrl = "https://reg.example/ccompat/".parse().expect("url");
        assert_eq!((u.tls, u.port, u.base.as_str()), (true, 443, "/ccompat"));
        let u: RegistryUrl = "http://[::1]:8081/x".parse().expect("url");
        assert_eq!((u.host.as_str(), u.port), ("::1", 8081));
        assert!("ftp://x".parse::<RegistryUrl>().is_err());
        assert!("http://u:p@x:1".parse::<RegistryUrl>().is_err());
        assert!("http://x:99999".parse::<RegistryUrl>().is_err());
        assert!("http://:80".parse::<RegistryUrl>().is_err());
    }
}
