//! `dead_letter.signing_keys`: the fleet's secrets that sign every record
//! antidote writes to a dead-letter topic (and every record `dlt replay`
//! and re-drive write back), and verify what is read back. The secrets
//! come from the environment or a file, never from the config text, and
//! never appear in logs or `Debug` output.

use std::path::PathBuf;

use serde::Deserialize;

use antidote_core::dlt_context::{Keys, MIN_KEY_BYTES};

/// One signing key: where its secret is, `{ env: NAME }` or `{ file: PATH }`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SigningKey {
    /// An environment variable holding the secret.
    #[serde(default)]
    pub env: Option<String>,
    /// A file holding the secret (one trailing newline is ignored).
    #[serde(default)]
    pub file: Option<PathBuf>,
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
        let mut s = match (&self.env, &self.file) {
            (Some(var), None) => std::env::var(var)
                .map_err(|_| format!("environment variable {var} is not set"))?
                .into_bytes(),
            (None, Some(p)) => std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?,
            _ => return Err("each key needs exactly one of `env` or `file`".into()),
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
        match (&self.env, &self.file) {
            (Some(v), _) => format!("env {v}"),
            (_, Some(p)) => format!("file {}", p.display()),
            _ => "key".into(),
        }
    }

    pub(super) fn resolve(&mut self, base: &std::path::Path) {
        if let Some(p) = &mut self.file {
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
        let env = |v: &str| SigningKey {
            env: Some(v.into()),
            file: None,
        };
        let list = vec![
            env("ANTIDOTE_TEST_SIGNING_KEY"),
            SigningKey {
                env: None,
                file: Some(f),
            },
        ];
        let k = keys(&list, UnsignedRecords::Refuse).unwrap();
        assert!(k.signing() && !k.accept_unsigned);
        assert!(!format!("{k:?}").contains("secret"));
        std::env::set_var("ANTIDOTE_TEST_SIGNING_KEY_SHORT", "short");
        let e = keys(
            &[env("ANTIDOTE_TEST_SIGNING_KEY_SHORT")],
            UnsignedRecords::Refuse,
        )
        .unwrap_err();
        assert!(
            e.contains("at least 16 bytes") && !e.contains("short\""),
            "{e}"
        );
        let e = keys(&[env("ANTIDOTE_TEST_UNSET_KEY")], UnsignedRecords::Refuse).unwrap_err();
        assert!(e.contains("ANTIDOTE_TEST_UNSET_KEY is not set"), "{e}");
        let both = SigningKey {
            env: Some("X".into()),
            file: Some("y".into()),
        };
        assert!(keys(&[both], UnsignedRecords::Refuse)
            .unwrap_err()
            .contains("exactly one"));
    }
}
