//! The DLT console: a page and its JSON API on the admin listener
//! (`/console`, only with `admin.console: true`), for the on-call engineer
//! who wants one page: what is diverted, at what rate, which rule, what
//! the records look like, which partitions are held and why, which keys
//! are blocked, and a replay to preview (and, with
//! `admin.console_actions: true`, to run, and breakers to close).
//!
//! Owns the routes under `/console`, their checks (every parameter
//! bounded, [`query`]), what a record may show ([`view`]) and the
//! handlers ([`api`]). It never reimplements a DLT operation: browsing,
//! decoding, replaying and closing are `service`'s, the same code as the
//! `dlt` commands. It never touches the data path: the overview reads the
//! metrics, the breakers and the blocked keys; Kafka reads run on a
//! thread of their own ([`Console::off_runtime`]), one or two at a time,
//! each within [`READ_DEADLINE`].
//!
//! Security: the admin listener's rules (no TLS of its own, bound where
//! `admin.listen` says; a bare port binds loopback only). Actions are POST
//! only, refused unless `console_actions`, need the console token
//! (`admin.console_token_file` or `_env`, at least 16 characters; sent as
//! `authorization: Bearer <token>`, compared in constant time; actions
//! without one are a load error), and need the page's own header
//! (`x-antidote-console: 1`, which a cross-site form cannot send and a
//! cross-site script cannot send without a CORS preflight, never
//! answered), a JSON body, and an `Origin` (when sent) naming this host.
//! Every response forbids framing and carries a CSP that allows the
//! page's own script and style only; the page sets all data as text.
//! A request whose `Host` is neither an IP address nor one of
//! `admin.console_hosts` (`localhost` by default) is refused: a hostile
//! page that rebinds its own DNS name to the admin address (DNS
//! rebinding) names its own host, so it cannot read the console.

pub mod api;
pub mod query;
pub mod view;

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;

use crate::config::Config;
use crate::dlt::blocked::BlockedKeys;
use crate::dlt::breaker::Breakers;
use crate::engine::Engine;

/// How long one console request may read Kafka (the admin listener ends a
/// connection after 15 s).
pub const READ_DEADLINE: Duration = Duration::from_secs(10);
/// Kafka reads served at once; more get 503.
const READS_AT_ONCE: usize = 2;
/// Largest POST body.
const MAX_BODY: usize = 16 * 1024;

const PAGE: &str = include_str!("assets/console.html");
const SCRIPT: &str = include_str!("assets/console.js");
const STYLE: &str = include_str!("assets/console.css");

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
    connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Whether a request naming `host` (the `Host` header, port included) may
/// be served: an IP address, or a name in `allowed` (any case).
fn host_allowed(host: Option<&str>, allowed: &[String]) -> bool {
    let Some(host) = host else { return false };
    let name = match host.strip_prefix('[') {
        // [v6]:port
        Some(rest) => match rest.split_once(']') {
            Some((v6, _)) => return v6.parse::<std::net::Ipv6Addr>().is_ok(),
            None => return false,
        },
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.parse::<std::net::IpAddr>().is_ok() || allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// A refused request: its status and message.
pub type Refusal = (StatusCode, String);

/// The console's state: what it reads (the running proxy's config, its
/// current policies, breakers and blocked keys) and its replay job.
pub struct Console {
    config: Config,
    engine: Arc<Engine>,
    breakers: Arc<Breakers>,
    blocked: Arc<BlockedKeys>,
    reads: Arc<Semaphore>,
    job: Arc<Mutex<Option<api::Job>>>,
    jobs: AtomicU64,
    /// What an action's `authorization: Bearer` must carry
    /// (`admin.console_token_file` or `_env`, read at start).
    token: Option<String>,
}

impl Console {
    /// The console of `config`, if `admin.console` is on.
    pub fn new(
        config: &Config,
        engine: Arc<Engine>,
        breakers: Arc<Breakers>,
        blocked: Arc<BlockedKeys>,
    ) -> Option<Arc<Console>> {
        config.admin.console.then(|| {
            Arc::new(Console {
                config: config.clone(),
                engine,
                breakers,
                blocked,
                reads: Arc::new(Semaphore::new(READS_AT_ONCE)),
                job: Arc::new(Mutex::new(None)),
                jobs: AtomicU64::new(0),
                // Checked when the config was loaded; a token that went
                // missing since leaves actions refused, never open.
                token: config.admin.console_token().ok().flatten(),
            })
        })
    }

    /// Whether the console may change anything (`admin.console_actions`).
    pub fn actions(&self) -> bool {
        self.config.admin.console_actions
    }

    /// Whether record contents may be shown (`logging.record_contents`).
    pub fn contents(&self) -> bool {
        self.config.logging.record_contents
    }

    /// The operations' context: the proxy's config and current policies.
    fn context(&self) -> crate::service::Context {
        crate::service::Context::new(self.config.clone(), self.engine.policies())
    }

    /// Answer one request under `/console`.
    pub async fn serve(self: Arc<Self>, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let host = parts
            .headers
            .get(hyper::header::HOST)
            .and_then(|v| v.to_str().ok());
        if !host_allowed(host, &self.config.admin.console_hosts) {
            return json_response(
                StatusCode::FORBIDDEN,
                &json!({ "error": "the Host header names neither an IP address nor one of admin.console_hosts" }),
            );
        }
        let method = parts.method.clone();
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().map(str::to_string);
        let q = query.as_deref();
        let get = method == Method::GET || method == Method::HEAD;
        let answer = match (path.as_str(), get, method == Method::POST) {
            ("/console" | "/console/", true, _) => return asset("text/html; charset=utf-8", PAGE),
            ("/console/console.js", true, _) => {
                return asset("text/javascript; charset=utf-8", SCRIPT)
            }
            ("/console/console.css", true, _) => return asset("text/css; charset=utf-8", STYLE),
            ("/console/api/overview", true, _) => api::overview(&self, q),
            ("/console/api/dlts", true, _) => api::dlts(&self, q).await,
            ("/console/api/records", true, _) => api::records(&self, q).await,
            ("/console/api/replay/preview", true, _) => api::preview(&self, q).await,
            ("/console/api/replay/job", true, _) => api::job(&self, q),
            ("/console/api/replay/execute", _, true) => {
                match self.action(&parts.headers, body).await {
                    Ok(b) => api::execute(&self, &b),
                    Err(r) => Err(r),
                }
            }
            ("/console/api/breaker/close", _, true) => {
                match self.action(&parts.headers, body).await {
                    Ok(b) => api::close(&self, &b).await,
                    Err(r) => Err(r),
                }
            }
            (
                "/console"
                | "/console/"
                | "/console/console.js"
                | "/console/console.css"
                | "/console/api/overview"
                | "/console/api/dlts"
                | "/console/api/records"
                | "/console/api/replay/preview"
                | "/console/api/replay/job",
                _,
                _,
            ) => Err((StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD".into())),
            ("/console/api/replay/execute" | "/console/api/breaker/close", _, _) => {
                Err((StatusCode::METHOD_NOT_ALLOWED, "only POST".into()))
            }
            _ => Err((StatusCode::NOT_FOUND, "not found".into())),
        };
        match answer {
            Ok((status, v)) => json_response(status, &v),
            Err((status, msg)) => json_response(status, &json!({ "error": msg })),
        }
    }

    /// The checks an action passes before its body is read (see the
    /// module comment); the body, at most [`MAX_BODY`] bytes.
    async fn action(&self, headers: &HeaderMap, body: Incoming) -> Result<Bytes, Refusal> {
        let forbidden = |m: &str| Err((StatusCode::FORBIDDEN, m.to_string()));
        if !self.actions() {
            return forbidden("console actions are off (admin.console_actions: false)");
        }
        let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
        let Some(token) = &self.token else {
            return forbidden("console actions have no credential configured");
        };
        let given = header("authorization").and_then(|v| v.strip_prefix("Bearer "));
        // Constant time: how much of a guess matched never shows in timing.
        let same: bool = given
            .unwrap_or("")
            .as_bytes()
            .ct_eq(token.as_bytes())
            .into();
        if !same {
            return Err((
                StatusCode::UNAUTHORIZED,
                "console actions need the console token (authorization: Bearer <token>)".into(),
            ));
        }
        if header("x-antidote-console") != Some("1") {
            return forbidden("missing the console's x-antidote-console header");
        }
        if let Some(site) = header("sec-fetch-site") {
            if site != "same-origin" && site != "none" {
                return forbidden("a cross-site request");
            }
        }
        if let Some(origin) = header("origin") {
            let host = header("host").unwrap_or("");
            let named = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"));
            if named.is_none_or(|o| !o.eq_ignore_ascii_case(host)) {
                return forbidden("the Origin header does not name this host");
            }
        }
        if !header("content-type").is_some_and(|c| c.starts_with("application/json")) {
            return Err((
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "the body must be application/json".into(),
            ));
        }
        match Limited::new(body, MAX_BODY).collect().await {
            Ok(b) => Ok(b.to_bytes()),
            Err(_) => Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is larger than {MAX_BODY} bytes, or was cut off"),
            )),
        }
    }

    /// Run `f` on a thread of its own with a current-thread runtime,
    /// within `deadline`: Kafka reads never run on the proxy's workers,
    /// and at most [`READS_AT_ONCE`] run at once (503 beyond).
    pub async fn off_runtime<T, F, Fut>(&self, deadline: Duration, f: F) -> Result<T, Refusal>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T>,
        T: Send + 'static,
    {
        let Ok(permit) = self.reads.clone().try_acquire_owned() else {
            return Err((
                StatusCode::SERVICE_UNAVAILABLE,
                "the console is busy with other reads; try again".into(),
            ));
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("antidote-console".into())
            .spawn(move || {
                let _permit = permit;
                let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                let out = rt.block_on(async { tokio::time::timeout(deadline, f()).await.ok() });
                let _ = tx.send(out);
            });
        if let Err(e) = spawned {
            return Err((StatusCode::SERVICE_UNAVAILABLE, format!("no thread: {e}")));
        }
        match rx.await {
            Ok(Some(v)) => Ok(v),
            Ok(None) => Err((
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the read did not finish within {deadline:?}: narrow the filters"),
            )),
            Err(_) => Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                "the console's reader stopped".into(),
            )),
        }
    }
}

/// A JSON answer with the console's headers.
fn json_response(status: StatusCode, v: &Value) -> Response<Full<Bytes>> {
    let mut r = asset("application/json", "");
    *r.body_mut() = Full::new(Bytes::from(v.to_string()));
    *r.status_mut() = status;
    r
}

/// A fixed body with the console's headers.
fn asset(content_type: &'static str, body: &'static str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    let h = resp.headers_mut();
    h.insert("content-type", HeaderValue::from_static(content_type));
    h.insert("cache-control", HeaderValue::from_static("no-store"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    resp
}

#[cfg(test)]
mod tests {
    use super::host_allowed;

    #[test]
    fn only_ip_addresses_and_the_allowed_names_reach_the_console() {
        let allowed = vec!["localhost".to_string(), "ops.internal".to_string()];
        for ok in [
            "127.0.0.1:9644",
            "10.1.2.3",
            "[::1]:9644",
            "localhost:9644",
            "LOCALHOST",
            "ops.internal:80",
        ] {
            assert!(host_allowed(Some(ok), &allowed), "{ok}");
        }
        for refused in [
            "evil.example:9644",
            "127.0.0.1.evil.example",
            "[::1",
            "[nope]:1",
            "",
        ] {
            assert!(!host_allowed(Some(refused), &allowed), "{refused}");
        }
        assert!(!host_allowed(None, &allowed), "no Host header");
    }
}
