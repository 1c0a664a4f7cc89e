//! Apicurio Registry's native API (v3), for values framed Apicurio's way:
//! a global or content id resolved to its schema text
//! (`GET /ids/globalIds/{id}`, `/ids/contentIds/{id}`), its artifact type
//! (`GET /search/versions?globalId=` or `contentId=`: the content answer
//! carries none) and its references (`GET /ids/.../{id}/references`, each
//! read from `/groups/{g}/artifacts/{a}/versions/{v}/content` with its own
//! references, dependencies first, bounded as the Confluent API's are).
//! Stored in the cache under the id's own namespace.

use serde::Deserialize;
use tracing::debug;

use super::{Answer, Registry, RegistryError, MAX_DEPTH, MAX_REFERENCES};
use crate::clock::now_ms;
use crate::policy::formats::compile_schema as compile;
use crate::policy::registry::{ApicurioId, Reference, Registered};

/// A reference as the native API lists it (`groupId` absent: `default`).
#[derive(Deserialize)]
struct NativeRef {
    #[serde(rename = "groupId", default)]
    group_id: Option<String>,
    #[serde(rename = "artifactId")]
    artifact_id: String,
    version: String,
    name: String,
}

#[derive(Deserialize)]
struct Search {
    #[serde(default)]
    versions: Vec<SearchVersion>,
}

#[derive(Deserialize)]
struct SearchVersion {
    #[serde(rename = "artifactType", default)]
    artifact_type: Option<String>,
}

impl Registry {
    /// One native fetch of `kind` id `id` into the cache.
    pub(super) async fn fetch_apicurio(
        &self,
        kind: ApicurioId,
        id: u64,
    ) -> Result<(), RegistryError> {
        let (segment, param) = match kind {
            ApicurioId::Global => ("globalIds", "globalId"),
            ApicurioId::Content => ("contentIds", "contentId"),
        };
        let path = format!("/ids/{segment}/{id}");
        let text = match self.get_native(&path).await? {
            Answer::NotFound => {
                self.cache.put_apicurio(kind, id, None, now_ms());
                return Ok(());
            }
            Answer::Found(b) => utf8(b, &path)?,
        };
        let search = format!("/search/versions?{param}={id}&limit=1");
        let schema_type = match self.get_native(&search).await? {
            Answer::Found(b) => serde_json::from_slice::<Search>(&b)
                .map_err(|_| RegistryError::BadAnswer(search.clone()))?
                .versions
                .into_iter()
                .find_map(|v| v.artifact_type),
            Answer::NotFound => None,
        };
        let mut refs = Vec::new();
        let registered = match (
            schema_type,
            self.native_refs(&format!("{path}/references"), 0, &mut refs)
                .await?,
        ) {
            (None, _) => Registered::Unusable(format!(
                "no version of {} {id} names its type",
                kind.as_str()
            )),
            (Some(_), Err(missing)) => Registered::Unusable(missing),
            (Some(t), Ok(())) => compile(Some(&t), &text, &refs),
        };
        debug!(
            id,
            kind = kind.as_str(),
            schema_type = registered.type_name(),
            "schema fetched from Apicurio"
        );
        self.cache
            .put_apicurio(kind, id, Some(registered), now_ms());
        Ok(())
    }

    /// The references listed at `path`, resolved (with theirs) into `out`.
    /// The inner `Err` names one the registry does not have.
    async fn native_refs(
        &self,
        path: &str,
        depth: usize,
        out: &mut Vec<Reference>,
    ) -> Result<Result<(), String>, RegistryError> {
        let list: Vec<NativeRef> = match self.get_native(path).await? {
            Answer::NotFound => return Ok(Ok(())),
            Answer::Found(b) => serde_json::from_slice(&b)
                .map_err(|_| RegistryError::BadAnswer(path.to_string()))?,
        };
        if !list.is_empty() && depth >= MAX_DEPTH {
            return Err(RegistryError::BadAnswer(format!(
                "{path}: references nested deeper than {MAX_DEPTH}"
            )));
        }
        for r in list {
            if out.iter().any(|o| o.name == r.name) {
                continue;
            }
            if out.len() >= MAX_REFERENCES {
                return Err(RegistryError::BadAnswer(format!(
                    "{path}: more than {MAX_REFERENCES} references"
                )));
            }
            let group = r.group_id.as_deref().unwrap_or("default");
            let version = format!(
                "/groups/{}/artifacts/{}/versions/{}",
                super::encode(group),
                super::encode(&r.artifact_id),
                super::encode(&r.version)
            );
            let content = format!("{version}/content");
            let text = match self.get_native(&content).await? {
                Answer::NotFound => {
                    return Ok(Err(format!(
                        "reference {} ({group}/{} version {}) is not in the registry",
                        r.name, r.artifact_id, r.version
                    )))
                }
                Answer::Found(b) => utf8(b, &content)?,
            };
            if let Err(m) =
                Box::pin(self.native_refs(&format!("{version}/references"), depth + 1, out)).await?
            {
                return Ok(Err(m));
            }
            out.push(Reference {
                name: r.name,
                schema: text,
            });
        }
        Ok(Ok(()))
    }

    /// GET `path` from the first native URL that answers.
    async fn get_native(&self, path: &str) -> Result<Answer, RegistryError> {
        if self.apicurio_urls.is_empty() {
            return Err(RegistryError::BadAnswer(format!(
                "{path}: no Apicurio URL (set schema_registry.apicurio_url, or a url ending in /apis/ccompat/v7)"
            )));
        }
        self.get_from(&self.apicurio_urls, path).await
    }
}

fn utf8(b: bytes::Bytes, path: &str) -> Result<String, RegistryError> {
    String::from_utf8(b.to_vec()).map_err(|_| RegistryError::BadAnswer(path.to_string()))
}
