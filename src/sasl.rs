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
    pub password: Option<String>,
    /// Name of an environment variable holding the password.
    #[serde(default)]
    pub password_env: Option<String>,
}

impl SaslConfig {
    /// The password, from the config or the named environment variable.
    pub fn password(&self) -> Result<String, String> {
        match (&self.password, &self.password_env) {
            (Some(p), _) => Ok(p.clone()),
            (None, Some(var)) => std::env::var(var)
                .map_err(|_| format!("sasl: environment variable {var} is not set")),
            (None, None) => Err("sasl: `password` or `password_env` is required".into()),
        }
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

/// A SCRAM exchange in progress (client side).
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

    /// Answer the server-first message with the client-final message.
    pub fn client_final(&mut self, server_first: &str) -> Result<String, String> {
        let mut nonce = None;
        let mut salt = None;
        let mut iterations = None;
        for part in server_first.split(',') {
            match part.split_at_checked(2) {
                Some(("r=", v)) => nonce = Some(v),
                Some(("s=", v)) => {
                    salt = Some(B64.decode(v).map_err(|e| format!("SCRAM salt: {e}"))?)
                }
                Some(("i=", v)) => iterations = v.parse::<u32>().ok(),
                _ => {}
            }
        }
        let (Some(nonce), Some(salt), Some(iterations)) = (nonce, salt, iterations) else {
            return Err(format!(
                "malformed SCRAM server-first message: {server_first}"
            ));
        };
        if !nonce.starts_with(&self.nonce) || iterations == 0 {
            return Err("SCRAM server nonce or iteration count is invalid".into());
        }
        let (pbkdf, hmac_alg, digest_alg, len) = self.algorithms();
        let mut salted = vec![0u8; len];
        let iterations = std::num::NonZeroU32::new(iterations).ok_or("SCRAM iterations")?;
        pbkdf2::derive(
            pbkdf,
            iterations,
            &salt,
            self.password.as_bytes(),
            &mut salted,
        );
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
        Ok(format!("{without_proof},p={}", B64.encode(proof)))
    }

    /// Check the server-final message (the server proves it knows the password too).
    pub fn verify_server_final(&self, server_final: &str) -> Result<(), String> {
        if let Some(e) = server_final.strip_prefix("e=") {
            return Err(format!("SCRAM authentication failed: {e}"));
        }
        let (auth_message, salted) = self.pending.as_ref().ok_or("SCRAM exchange out of order")?;
        let (_, hmac_alg, _, _) = self.algorithms();
        let server_key = hmac::sign(&hmac::Key::new(hmac_alg, salted), b"Server Key");
        let expected = hmac::sign(
            &hmac::Key::new(hmac_alg, server_key.as_ref()),
            auth_message.as_bytes(),
        );
        let got = server_final
            .strip_prefix("v=")
            .and_then(|v| B64.decode(v).ok())
            .ok_or("malformed SCRAM server-final message")?;
        if got.as_slice() != expected.as_ref() {
            return Err("SCRAM server signature does not match: not the expected server".into());
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

    #[test]
    fn usernames_are_escaped() {
        assert_eq!(
            Scram::new(Mechanism::ScramSha256, "a=b,c", "p", "n").client_first(),
            "n,,n=a=3Db=2Cc,r=n"
        );
    }
}
