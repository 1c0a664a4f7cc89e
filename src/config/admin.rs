//! `admin`: the HTTP listener of `/metrics`, `/healthz` and `/readyz`, and
//! the DLT console on it: whether it is served, whether it may act, and
//! the credential its actions need.

use std::path::PathBuf;

use serde::{de, Deserialize, Deserializer};

use super::HostPort;

/// The admin HTTP listener.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Admin {
    /// Address of `/metrics`, `/healthz` and `/readyz`; absent disables it.
    /// A bare port (`9644` or `:9644`) binds 127.0.0.1 only.
    #[serde(default, deserialize_with = "de_admin_listen")]
    pub listen: Option<HostPort>,
    /// Serve the DLT console at `/console` (read-only unless `console_actions`).
    #[serde(default)]
    pub console: bool,
    /// Let the console replay records and close breakers.
    #[serde(default)]
    pub console_actions: bool,
    /// The credential console actions need (`authorization: Bearer
    /// <token>`): a file holding the token...
    #[serde(default)]
    pub console_token_file: Option<PathBuf>,
    /// ... or an environment variable holding it.
    #[serde(default)]
    pub console_token_env: Option<String>,
    /// Host names a browser may use to reach the console (besides IP
    /// addresses): a request naming any other host is refused, so a page
    /// that rebinds its own DNS name to the admin address (DNS rebinding)
    /// cannot read the console.
    #[serde(default = "default_console_hosts")]
    pub console_hosts: Vec<String>,
}

fn default_console_hosts() -> Vec<String> {
    vec!["localhost".into()]
}

impl Default for Admin {
    fn default() -> Self {
        Admin {
            listen: None,
            console: false,
            console_actions: false,
            console_token_file: None,
            console_token_env: None,
            console_hosts: default_console_hosts(),
        }
    }
}

/// The shortest console token accepted: guessing one must not be a matter
/// of a few tries.
pub const MIN_CONSOLE_TOKEN: usize = 16;

impl Admin {
    /// The console's action credential, if one is configured (read from
    /// its file or environment variable now).
    pub fn console_token(&self) -> Result<Option<String>, String> {
        let token = match (&self.console_token_file, &self.console_token_env) {
            (Some(_), Some(_)) => {
                return Err("admin: give console_token_file or console_token_env, not both".into())
            }
            (Some(f), None) => std::fs::read_to_string(f)
                .map_err(|e| format!("admin.console_token_file {}: {e}", f.display()))?,
            (None, Some(var)) => std::env::var(var).map_err(|_| {
                format!("admin.console_token_env: environment variable {var} is not set")
            })?,
            (None, None) => return Ok(None),
        };
        let token = token.trim();
        if token.len() < MIN_CONSOLE_TOKEN {
            return Err(format!(
                "admin: the console token must be at least {MIN_CONSOLE_TOKEN} characters"
            ));
        }
        Ok(Some(token.to_string()))
    }
}

/// `admin.listen`: `host:port`, or a bare port bound to loopback.
fn de_admin_listen<'de, D: Deserializer<'de>>(d: D) -> Result<Option<HostPort>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Port(u16),
        Text(String),
    }
    let loopback = |port| HostPort {
        host: "127.0.0.1".into(),
        port,
    };
    match Raw::deserialize(d)? {
        Raw::Port(p) => Ok(Some(loopback(p))),
        Raw::Text(t) => match t.trim_start_matches(':').parse::<u16>() {
            Ok(p) => Ok(Some(loopback(p))),
            Err(_) => t.parse().map(Some).map_err(de::Error::custom),
        },
    }
}
