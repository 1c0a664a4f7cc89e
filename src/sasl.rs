//! SASL for the proxy's own connections (metadata lookups, the dead-letter
//! producer, the ledger and `dlt` commands): PLAIN and SCRAM-SHA-256/512
//! (RFC 5802, RFC 7677), over SaslHandshake v1 + SaslAuthenticate.
//!
//! Client connections never use this: their SASL exchanges are relayed
//! untouched (see `proxy::relay`). The SCRAM arithmetic is pure and tested
//! against the RFC 7677 vector; the exchange itself lives in `client`.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ring::{digest, hmac, pbkdf2};
use serde::Deserialize;

/// SASL settings for one cluster (`upstream.sasl`, `dead_letter.sasl`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaslConfig {
    pub mechanism: Mechanism,
    pub username: String,
    /// The password, or use `password_env` to read it from the environment.
    #[serde(default)]
    pub password: Option<Secret>,
    /// Name of an environment variable holding the password.
    #[serde(default)]
    pub password_env: Option<String>,
}

/// Why a SASL exchange (or its configuration) failed.
#[derive(Debug, thiserror::Error)]
pub enum SaslError {
    #[error("sasl: environment variable {0} is not set")]
    PasswordEnvUnset(String),
    #[error("sasl: `password` or `password_env` is required")]
    NoPassword,
    #[error("SCRAM key derivation failed: {0}")]
    KeyDerivation(String),
    #[error("SCRAM salt: {0}")]
    Salt(base64::DecodeError),
    #[error("malformed SCRAM {0} message")]
    Malformed(&'static str),
    #[error("SCRAM server nonce does not extend the client nonce")]
    Nonce,
    #[error("SCRAM iteration count {0} from the server is outside Kafka's bounds {lo}..={hi}", lo = SCRAM_ITERATIONS.start(), hi = SCRAM_ITERATIONS.end())]
    Iterations(u32),
    #[error("SCRAM authentication failed: {0}")]
    Rejected(String),
    #[error("SCRAM exchange out of order")]
    OutOfOrder,
    #[error("SCRAM server signature does not match: not the expected server")]
    ServerSignature,
}

impl SaslConfig {
    /// The password, from the config or the named environment variable.
    pub fn password(&self) -> Result<String, SaslError> {
        match (&self.password, &self.password_env) {
            (Some(p), _) => Ok(p.expose().to_string()),
            (None, Some(var)) => {
                std::env::var(var).map_err(|_| SaslError::PasswordEnvUnset(var.clone()))
            }
            (None, None) => Err(SaslError::NoPassword),
        }
    }
}

/// A secret from the config: prints as `"<redacted>"` in `{:?}`, so a
/// logged or debug-printed config never shows it (docs/design/threat-model.md: passwords
/// never appear in logs or Debug output).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    /// The secret itself, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

/// Supported mechanisms, spelt as Kafka spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Mechanism {
    #[serde(rename = "PLAIN")]
    Plain,
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

impl Mechanism {
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// The PLAIN token: authzid (empty) NUL username NUL password.
pub fn plain_token(user: &str, password: &str) -> Vec<u8> {
    format!("\0{user}\0{password}").into_bytes()
}

/// Kafka's bounds on SCRAM iterations (`ScramMechanism`: 4096 to 16384).
pub const SCRAM_ITERATIONS: std::ops::RangeInclusive<u32> = 4096..=16384;

/// What the client needs from a checked server-first message.
struct ServerFirst {
    nonce: String,
    salt: Vec<u8>,
    iterations: std::num::NonZeroU32,
}

/// PBKDF2 of the password: the expensive step of SCRAM.
fn salted_password(
    alg: pbkdf2::Algorithm,
    len: usize,
    iterations: std::num::NonZeroU32,
    salt: &[u8],
    password: &str,
) -> Vec<u8> {
    #[cfg(test)]
    tests::record_derive_thread();
    let mut salted = vec![0u8; len];
    pbkdf2::derive(alg, iterations, salt, password.as_bytes(), &mut salted);
    salted
}

/// A SCRAM exchange in progress (client side). No `Debug`: it holds the
/// password and, later, the salted password.
pub struct Scram {
    mech: Mechanism,
    password: String,
    client_first_bare: String,
    nonce: String,
    /// Set after the client-final message: (auth message, salted password).
    pending: Option<(String, Vec<u8>)>,
}

impl Scram {
    /// Start with a client nonce (random in production, fixed in tests).
    pub fn new(mech: Mechanism, user: &str, password: &str, nonce: &str) -> Scram {
        let user = user.replace('=', "=3D").replace(',', "=2C");
        Scram {
            mech,
            password: password.to_string(),
            client_first_bare: format!("n={user},r={nonce}"),
            nonce: nonce.to_string(),
            pending: None,
        }
    }

    /// A fresh random nonce.
    pub fn random_nonce() -> String {
        use ring::rand::SecureRandom;
        let mut bytes = [0u8; 24];
        let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
        B64.encode(bytes)
    }

    pub fn client_first(&self) -> String {
        format!("n,,{}", self.client_first_bare)
    }

    /// Answer the server-first message with the client-final message,
    /// deriving the salted password on the calling thread (tests, tools).
    pub fn client_final(&mut self, server_first: &str) -> Result<String, SaslError> {
        let first = self.parse_server_first(server_first)?;
        let (alg, len) = self.pbkdf2_algorithm();
        let salted = salted_password(alg, len, first.iterations, &first.salt, &self.password);
        Ok(self.finish(server_first, &first.nonce, salted))
    }

    /// `client_final`, with PBKDF2 (up to 16384 HMAC rounds) run on a
    /// blocking thread so that it never stalls a runtime worker that is
    /// relaying other connections.
    pub async fn client_final_off_runtime(
        &mut self,
        server_first: &str,
    ) -> Result<String, SaslError> {
        let first = self.parse_server_first(server_first)?;
        let (alg, len) = self.pbkdf2_algorithm();
        let password = self.password.clone();
        let salt = first.salt;
        let iterations = first.iterations;
        let salted = tokio::task::spawn_blocking(move || {
            salted_password(alg, len, iterations, &salt, &password)
        })
        .await
        .map_err(|e| SaslError::KeyDerivation(e.to_string()))?;
        Ok(self.finish(server_first, &first.nonce, salted))
    }

    /// Check a server-first message: our nonce extended, a salt, and an
    /// iteration count within Kafka's bounds (a hostile server could
    /// otherwise ask for billions of rounds, or a weak handful).
    fn parse_server_first(&self, server_first: &str) -> Result<ServerFirst, SaslError> {
        let mut nonce = None;
        let mut salt = None;
        let mut iterations = None;
        for part in server_first.split(',') {
            match part.split_at_checked(2) {
                Some(("r=", v)) => nonce = Some(v),
                Some(("s=", v)) => salt = Some(B64.decode(v).map_err(SaslError::Salt)?),
                Some(("i=", v)) => iterations = v.parse::<u32>().ok(),
                _ => {}
            }
        }
        let (Some(nonce), Some(salt), Some(iterations)) = (nonce, salt, iterations) else {
            return Err(SaslError::Malformed("server-first"));
        };
        if !nonce.starts_with(&self.nonce) {
            return Err(SaslError::Nonce);
        }
        if !SCRAM_ITERATIONS.contains(&iterations) {
            return Err(SaslError::Iterations(iterations));
        }
        let iterations =
            std::num::NonZeroU32::new(iterations).ok_or(SaslError::Iterations(iterations))?;
        Ok(ServerFirst {
            nonce: nonce.to_string(),
            salt,
            iterations,
        })
    }

    /// The client-final message, given the salted password.
    fn finish(&mut self, server_first: &str, nonce: &str, salted: Vec<u8>) -> String {
        let (_, hmac_alg, digest_alg, _) = self.algorithms();
        let client_key = hmac::sign(&hmac::Key::new(hmac_alg, &salted), b"Client Key");
        let stored_key = digest::digest(digest_alg, client_key.as_ref());
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let signature = hmac::sign(
            &hmac::Key::new(hmac_alg, stored_key.as_ref()),
            auth_message.as_bytes(),
        );
        let proof: Vec<u8> = client_key
            .as_ref()
            .iter()
            .zip(signature.as_ref())
            .map(|(a, b)| a ^ b)
            .collect();
        self.pending = Some((auth_message, salted));
        format!("{without_proof},p={}", B64.encode(proof))
    }

    fn pbkdf2_algorithm(&self) -> (pbkdf2::Algorithm, usize) {
        let (alg, _, _, len) = self.algorithms();
        (alg, len)
    }

    /// Check the server-final message (the server proves it knows the password too).
    pub fn verify_server_final(&self, server_final: &str) -> Result<(), SaslError> {
        if let Some(e) = server_final.strip_prefix("e=") {
            return Err(SaslError::Rejected(e.to_string()));
        }
        let (auth_message, salted) = self.pending.as_ref().ok_or(SaslError::OutOfOrder)?;
        let (_, hmac_alg, _, _) = self.algorithms();
        let server_key = hmac::sign(&hmac::Key::new(hmac_alg, salted), b"Server Key");
        let expected = hmac::sign(
            &hmac::Key::new(hmac_alg, server_key.as_ref()),
            auth_message.as_bytes(),
        );
        let got = server_final
            .strip_prefix("v=")
            .and_then(|v| B64.decode(v).ok())
            .ok_or(SaslError::Malformed("server-final"))?;
        if got.as_slice() != expected.as_ref() {
            return Err(SaslError::ServerSignature);
        }
        Ok(())
    }

    fn algorithms(
        &self,
    ) -> (
        pbkdf2::Algorithm,
        hmac::Algorithm,
        &'static digest::Algorithm,
        usize,
    ) {
        match self.mech {
            Mechanism::ScramSha512 => (
                pbkdf2::PBKDF2_HMAC_SHA512,
                hmac::HMAC_SHA512,
                &digest::SHA512,
                64,
            ),
            _ => (
                pbkdf2::PBKDF2_HMAC_SHA256,
                hmac::HMAC_SHA256,
                &digest::SHA256,
                32,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scram_sha_256_matches_the_rfc_7677_example() {
        let mut s = Scram::new(
            Mechanism::ScramSha256,
            "user",
            "pencil",
            "rOprNGfwEbeRWgbNEkqO",
        );
        assert_eq!(s.client_first(), "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        assert_eq!(
            s.client_final(server_first).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        s.verify_server_final("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap();
        assert!(s.verify_server_final("v=AAAA").is_err());
        assert!(s.verify_server_final("e=invalid-proof").is_err());
    }

    #[test]
    fn a_server_nonce_that_does_not_extend_ours_is_refused() {
        let mut s = Scram::new(Mechanism::ScramSha512, "u", "p", "abc");
        assert!(s.client_final("r=xyz,s=AAAA,i=4096").is_err());
        assert!(s.client_final("garbage").is_err());
    }

    /// Every thread PBKDF2 ran on, in this test process.
    static DERIVE_THREADS: std::sync::Mutex<Vec<std::thread::ThreadId>> =
        std::sync::Mutex::new(Vec::new());

    pub(super) fn record_derive_thread() {
        if let Ok(mut t) = DERIVE_THREADS.lock() {
            t.push(std::thread::current().id());
        }
    }

    const RFC_FIRST: &str =
        "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";

    #[test]
    fn iteration_counts_outside_kafkas_bounds_are_refused() {
        for i in [0u32, 1, 4095, 16385, 1_000_000_000] {
            let mut s = Scram::new(Mechanism::ScramSha256, "u", "p", "abc");
            let err = s
                .client_final(&format!("r=abcdef,s=AAAA,i={i}"))
                .unwrap_err();
            assert!(
                err.to_string()
                    .contains("outside Kafka's bounds 4096..=16384"),
                "{i}: {err}"
            );
        }
        for i in [4096u32, 16384] {
            let mut s = Scram::new(Mechanism::ScramSha256, "u", "p", "abc");
            assert!(s.client_final(&format!("r=abcdef,s=AAAA,i={i}")).is_ok());
        }
    }

    #[test]
    fn pbkdf2_runs_off_the_runtime_thread_with_the_same_result() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut s = Scram::new(
            Mechanism::ScramSha256,
            "user",
            "pencil",
            "rOprNGfwEbeRWgbNEkqO",
        );
        let runtime_thread = std::thread::current().id();
        let got = rt.block_on(s.client_final_off_runtime(RFC_FIRST)).unwrap();
        // Other tests derive on their own threads, never on this one.
        let threads = DERIVE_THREADS.lock().unwrap().clone();
        assert!(!threads.is_empty());
        assert!(
            !threads.contains(&runtime_thread),
            "PBKDF2 ran on the runtime thread"
        );
        assert!(got.ends_with("p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="));
        s.verify_server_final("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap();
    }

    #[test]
    fn usernames_are_escaped() {
        assert_eq!(
            Scram::new(Mechanism::ScramSha256, "a=b,c", "p", "n").client_first(),
            "n,,n=a=3Db=2Cc,r=n"
        );
    }
}
