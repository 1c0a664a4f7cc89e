//! `dead_letter.signing_keys`: the fleet's secrets that sign every record
//! antidote writes to a dead-letter topic (and every record `dlt replay`
//! and re-drive write back), and verify what is read back. The secrets
//! come from the environment or a file, never from the config text, and
//! never appear in logs or `Debug` output.

use std::path::PathBuf;

use serde::Deserialize;

use antidote_core::dlt_context::{Keys, MIN_KEY_BYTES};

/// One signing key: where its secret is.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
pub enum SigningKey {
    /// An environment variable holding the secret.
    Env(String),
    /// A file holding the secret (one trailing newline is ignored).
    File(PathBuf),
}

/// `dead_letter.unsigned_records`: what readers do with a record that has
/// no signature while keys are set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnsignedRecords {
    /// Refused: only signed records are antidote's (the default).
    #[default]
    Refuse,
    /// Accepted by their frame only, as without keys: while a fleet moves
    /// to signing and its DLTs still hold unsigned records that matter.
    Accept,
}

impl SigningKey {
    fn secret(&self) -> Result<Vec<u8>, String> {
        let mut s = match self {
            SigningKey::Env(var) => std::env::var(var)
                .map_err(|_| format!("environment variable {var} is not set"))?
                .into_bytes(),
            SigningKey::File(p) => std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?,
        };
        if s.last() == Some(&b'\n') {
            s.pop();
        }
        if s.len() < MIN_KEY_BYTES {
            return Err(format!(
                "{}: a signing key needs at least {MIN_KEY_BYTES} bytes",
                self.name()
            ));
        }
        Ok(s)
    }

    fn name(&self) -> String {
        match self {
            SigningKey::Env(v) => format!("env {v}"),
            SigningKey::File(p) => format!("file {}", p.display()),
        }
    }

    pub(super) fn resolve(&mut self, base: &std::path::Path) {
        if let SigningKey::File(p) = self {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
    }
}

/// The keys, read from their sources: the first signs, all verify.
pub fn keys(list: &[SigningKey], unsigned: UnsignedRecords) -> Result<Keys, String> {
    let secrets = list
        .iter()
        .map(SigningKey::secret)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("dead_letter.signing_keys: {e}"))?;
    Ok(Keys::new(&secrets, unsigned == UnsignedRecords::Accept))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_from_env_and_files_and_short_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("k");
        std::fs::write(&f, "a-secret-from-a-file-0001\n").unwrap();
        std::env::set_var("ANTIDOTE_TEST_SIGNING_KEY", "a-secret-from-the-env-01");
        let list = vec![
            SigningKey::Env("ANTIDOTE_TEST_SIGNING_KEY".into()),
            SigningKey::File(f),
        ];
        let k = keys(&list, UnsignedRecords::Refuse).unwrap();
        assert!(k.signing() && !k.accept_unsigned);
        assert!(!format!("{k:?}").contains("secret"));
        std::env::set_var("ANTIDOTE_TEST_SIGNING_KEY_SHORT", "short");
        let e = keys(
            &[SigningKey::Env("ANTIDOTE_TEST_SIGNING_KEY_SHORT".into())],
            UnsignedRecords::Refuse,
        )
        .unwrap_err();
        assert!(
            e.contains("at least 16 bytes") && !e.contains("short\""),
            "{e}"
        );
        let e = keys(
            &[SigningKey::Env("ANTIDOTE_TEST_UNSET_KEY".into())],
            UnsignedRecords::Refuse,
        )
        .unwrap_err();
        assert!(e.contains("ANTIDOTE_TEST_UNSET_KEY is not set"), "{e}");
    }
}
