//! TLS on both sides of the proxy, independently: a rustls server config for
//! client connections (optionally verifying client certificates, mTLS) and a
//! rustls client config for broker connections (a CA bundle, optionally a
//! client certificate, which relayed client connections do not present
//! unless configured). Errors name the file that could not be used.
//!
//! The listener's certificate sits behind [`Certificates`], a rustls
//! `ResolvesServerCert` whose key can be swapped while the proxy runs: each
//! new handshake reads the current one, established connections keep the
//! keys they negotiated, and a replacement that does not load (unreadable,
//! key not matching the certificate) never replaces a working one.

use std::path::Path;
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{Acceptor, ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::{LazyConfigAcceptor, TlsConnector};

use crate::config::{ClientTls, ServerTls};

/// A TLS file or setting that could not be used.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError(format!("{}: cannot read certificates: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(TlsError(format!(
            "{}: no PEM certificate found",
            path.display()
        )));
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| TlsError(format!("{}: cannot read private key: {e}", path.display())))
}

fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in certs(path)? {
        store
            .add(cert)
            .map_err(|e| TlsError(format!("{}: bad CA certificate: {e}", path.display())))?;
    }
    Ok(store)
}

/// The listener's certificate chain and key, replaceable at run time.
#[derive(Debug)]
pub struct Certificates {
    current: RwLock<Arc<CertifiedKey>>,
}

impl Certificates {
    fn load(cfg: &ServerTls) -> Result<Arc<CertifiedKey>, TlsError> {
        let key = CertifiedKey::from_der(certs(&cfg.cert)?, key(&cfg.key)?, &provider()).map_err(
            |e| {
                let why = match e {
                    rustls::Error::InconsistentKeys(_) => {
                        "the private key does not belong to the certificate".to_string()
                    }
                    other => other.to_string(),
                };
                TlsError(format!(
                    "{} with {}: {why}",
                    cfg.cert.display(),
                    cfg.key.display()
                ))
            },
        )?;
        Ok(Arc::new(key))
    }

    /// Read `cfg`'s files again and use them for new handshakes; on any
    /// error the current certificate stays. Returns the new certificate's
    /// SHA-256 fingerprint (hex), for the log.
    pub fn reload(&self, cfg: &ServerTls) -> Result<String, TlsError> {
        let key = Self::load(cfg)?;
        let print = fingerprint(&key);
        match self.current.write() {
            Ok(mut c) => *c = key,
            Err(poisoned) => *poisoned.into_inner() = key,
        }
        Ok(print)
    }

    /// The SHA-256 fingerprint (hex) of the certificate in use.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.current())
    }

    fn current(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// SHA-256 of the end-entity certificate, as operators compare it
/// (`openssl x509 -fingerprint -sha256`, without colons).
fn fingerprint(key: &CertifiedKey) -> String {
    let Some(cert) = key.cert.first() else {
        return String::new();
    };
    ring::digest::digest(&ring::digest::SHA256, cert.as_ref())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// TLS towards clients: the server config and its swappable certificate.
#[derive(Clone)]
pub struct Server {
    config: Arc<ServerConfig>,
    pub certificates: Arc<Certificates>,
}

impl Server {
    /// A plain acceptor over this server's config (no SNI step).
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.clone())
    }
}

/// The TLS server for client connections.
pub fn server(cfg: &ServerTls) -> Result<Server, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(e.to_string()))?;
    let builder = match &cfg.client_ca {
        Some(ca) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                    .build()
                    .map_err(|e| TlsError(format!("{}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let certificates = Arc::new(Certificates {
        current: RwLock::new(Certificates::load(cfg)?),
    });
    let config = builder.with_cert_resolver(certificates.clone());
    Ok(Server {
        config: Arc::new(config),
        certificates,
    })
}

/// Why a client's TLS connection was not established.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    /// Logged as "TLS handshake with client failed error=<this>".
    #[error("{0}")]
    Handshake(#[from] std::io::Error),
    /// `route` refused the server name (or its absence).
    #[error("server name {0:?} is not served")]
    Refused(Option<String>),
}

/// Read the client's ClientHello, let `route` pick a target from its
/// server name (SNI), and only then finish the handshake: a name nobody
/// serves costs no key exchange.
pub async fn accept<T>(
    server: &Server,
    tcp: TcpStream,
    route: impl FnOnce(Option<&str>) -> Option<T>,
) -> Result<(TlsStream<TcpStream>, T), AcceptError> {
    let start = LazyConfigAcceptor::new(Acceptor::default(), tcp).await?;
    let name = start.client_hello().server_name().map(str::to_string);
    let Some(target) = route(name.as_deref()) else {
        return Err(AcceptError::Refused(name));
    };
    let stream = start.into_stream(server.config.clone()).await?;
    Ok((stream, target))
}

/// How the proxy connects to brokers over TLS.
#[derive(Clone)]
pub struct Upstream {
    pub connector: TlsConnector,
    /// Overrides the name verified in the broker's certificate.
    pub server_name: Option<ServerName<'static>>,
}

impl Upstream {
    /// The name to verify for a connection to `host`.
    pub fn server_name(&self, host: &str) -> Result<ServerName<'static>, TlsError> {
        match &self.server_name {
            Some(n) => Ok(n.clone()),
            None => ServerName::try_from(host.to_string())
                .map_err(|e| TlsError(format!("`{host}` is not a valid TLS server name: {e}"))),
        }
    }
}

/// The connector for broker connections.
pub fn connector(cfg: &ClientTls) -> Result<Upstream, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(e.to_string()))?
        .with_root_certificates(roots(&cfg.ca)?);
    let config = match (&cfg.cert, &cfg.key) {
        (Some(cert), Some(k)) => builder
            .with_client_auth_cert(certs(cert)?, key(k)?)
            .map_err(|e| TlsError(format!("{}: {e}", cert.display())))?,
        _ => builder.with_no_client_auth(),
    };
    let server_name = cfg
        .server_name
        .as_ref()
        .map(|n| {
            ServerName::try_from(n.clone())
                .map_err(|e| TlsError(format!("upstream.tls.server_name `{n}`: {e}")))
        })
        .transpose()?;
    Ok(Upstream {
        connector: TlsConnector::from(Arc::new(config)),
        server_name,
    })
}

/// The connector for relayed client connections: no client certificate
/// unless `relay_client_cert` is set. Presenting the proxy's own
/// certificate would give every client the proxy's principal at the
/// brokers (its rights on DLTs, CreateTopics...); client identity reaches
/// brokers through SASL passthrough instead.
pub fn relay_connector(cfg: &ClientTls) -> Result<Upstream, TlsError> {
    if cfg.relay_client_cert {
        return connector(cfg);
    }
    connector(&ClientTls {
        cert: None,
        key: None,
        ..cfg.clone()
    })
}

/// Every TLS file the config names, loaded once to report problems early
/// (`antidote check`, start). Returns one message per problem.
pub fn check(cfg: &crate::config::Config) -> Vec<String> {
    let mut errors = Vec::new();
    if let Some(t) = &cfg.listen.tls {
        if let Err(e) = server(t) {
            errors.push(format!("listen.tls: {e}"));
        }
    }
    for (name, t) in [
        ("upstream.tls", &cfg.upstream.tls),
        ("dead_letter.tls", &cfg.dead_letter.tls),
    ] {
        if let Some(t) = t {
            if let Err(e) = connector(t) {
                errors.push(format!("{name}: {e}"));
            }
        }
    }
    errors
}
