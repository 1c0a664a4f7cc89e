//! The registry client against an in-process HTTP stub: answers, 404,
//! 5xx with failover to the next URL, timeouts, oversized bodies, basic
//! auth, references, and one request for concurrent misses of one id.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::policy::registry::Known;

type Handler = Arc<dyn Fn(&str, &str) -> (u16, String, u64) + Send + Sync>;

/// A stub registry: `handler(path, request text)` gives status, body and a
/// delay in ms. Returns its URL and the request counter.
async fn stub(handler: Handler) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let h = handler.clone();
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut n = 0;
                while !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf[n..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => n += k,
                    }
                }
                counter.fetch_add(1, Ordering::SeqCst);
                let text = String::from_utf8_lossy(&buf[..n]).to_string();
                let path = text.split(' ').nth(1).unwrap_or("").to_string();
                let (status, body, delay) = h(&path, &text);
                tokio::time::sleep(Duration::from_millis(delay)).await;
                let resp = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    (format!("http://{addr}"), hits)
}

fn registry(urls: &[&str], timeout_ms: u64) -> Arc<Registry> {
    let yaml = format!(
        "url: [{}]\ntimeout: {timeout_ms}ms\nbasic_auth: {{ username: u, password: p }}\n",
        urls.iter()
            .map(|u| format!("\"{u}\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let cfg: RegistryConfig = serde_yaml::from_str(&yaml).expect("config");
    Registry::new(&cfg, SchemaCache::new()).expect("registry")
}

const AVSC: &str = r#"{\"type\":\"string\"}"#;

fn ok_schema() -> Handler {
    Arc::new(|path, _| match path {
        "/schemas/ids/1" => (200, format!(r#"{{"schema":"{AVSC}"}}"#), 0),
        _ => (
            404,
            r#"{"error_code":40403,"message":"Schema not found"}"#.into(),
            0,
        ),
    })
}

#[tokio::test]
async fn a_schema_is_fetched_compiled_and_cached_and_404_is_not_found() {
    let (url, hits) = stub(ok_schema()).await;
    let r = registry(&[&url], 2000);
    assert!(r.fetch_once(Want::Schema(1)).await);
    assert!(matches!(r.cache().schema(1, now_ms()), Known::Found(_)));
    assert!(r.fetch_once(Want::Schema(1)).await, "cached: no request");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert!(r.fetch_once(Want::Schema(2)).await);
    assert!(matches!(r.cache().schema(2, now_ms()), Known::NotFound));
}

#[tokio::test]
async fn concurrent_misses_for_one_id_share_one_request() {
    let slow: Handler = Arc::new(|_, _| (200, format!(r#"{{"schema":"{AVSC}"}}"#), 300));
    let (url, hits) = stub(slow).await;
    let r = registry(&[&url], 2000);
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let r = r.clone();
            tokio::spawn(async move { r.fetch_once(Want::Schema(1)).await })
        })
        .collect();
    for t in tasks {
        assert!(t.await.expect("task"));
    }
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_5xx_tries_the_next_url_and_when_all_fail_nothing_is_cached() {
    let broken: Handler = Arc::new(|_, _| (500, "{}".into(), 0));
    let (bad, bad_hits) = stub(broken.clone()).await;
    let (good, _) = stub(ok_schema()).await;
    let r = registry(&[&bad, &good], 2000);
    assert!(r.fetch_once(Want::Schema(1)).await);
    assert_eq!(bad_hits.load(Ordering::SeqCst), 1);
    let (bad2, _) = stub(broken).await;
    let r = registry(&[&bad, &bad2], 2000);
    assert!(!r.fetch_once(Want::Schema(1)).await);
    assert!(matches!(r.cache().schema(1, now_ms()), Known::Missing));
}

#[tokio::test]
async fn a_registry_slower_than_the_timeout_is_a_failure() {
    let slow: Handler = Arc::new(|_, _| (200, format!(r#"{{"schema":"{AVSC}"}}"#), 2000));
    let (url, _) = stub(slow).await;
    let r = registry(&[&url], 200);
    let t = std::time::Instant::now();
    assert!(!r.fetch_once(Want::Schema(1)).await);
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    assert!(matches!(r.cache().schema(1, now_ms()), Known::Missing));
}

#[tokio::test]
async fn an_oversized_answer_is_refused() {
    let huge: Handler = Arc::new(|_, _| (200, "x".repeat(MAX_BODY + 10), 0));
    let (url, _) = stub(huge).await;
    let r = registry(&[&url], 2000);
    assert!(!r.fetch_once(Want::Schema(1)).await);
}

#[tokio::test]
async fn basic_auth_is_sent_and_references_and_subjects_resolve() {
    let h: Handler = Arc::new(|path, req| {
        // base64("u:p") = dTpw
        if !req.contains("authorization: Basic dTpw") && !req.contains("Authorization: Basic dTpw")
        {
            return (401, "{}".into(), 0);
        }
        match path {
            "/schemas/ids/3" => (
                200,
                r#"{"schemaType":"PROTOBUF","schema":"syntax = \"proto3\"; import \"l.proto\"; message T { L at = 1; }","references":[{"name":"l.proto","subject":"l value","version":1}]}"#.into(),
                0,
            ),
            "/subjects/l%20value/versions/1" => (200, r#"{"schema":"syntax = \"proto3\"; message L { double lat = 1; }"}"#.into(), 0),
            "/schemas/ids/3/versions" => (200, r#"[{"subject":"t-value","version":2}]"#.into(), 0),
            _ => (404, "{}".into(), 0),
        }
    });
    let (url, _) = stub(h).await;
    let r = registry(&[&url], 2000);
    assert!(r.fetch_once(Want::Schema(3)).await);
    match r.cache().schema(3, now_ms()) {
        Known::Found(s) => assert!(matches!(*s, Registered::Protobuf(..)), "{s:?}"),
        _ => panic!("not found"),
    }
    assert!(r.fetch_once(Want::Subjects(3)).await);
    match r.cache().subjects(3, now_ms()) {
        Known::Found(l) => assert_eq!(&l[..], ["t-value".to_string()]),
        _ => panic!("no subjects"),
    }
}

#[tokio::test]
async fn resolve_wants_drains_what_judges_asked_for() {
    let (url, _) = stub(ok_schema()).await;
    let r = registry(&[&url], 2000);
    let _ = r.cache().schema(1, now_ms());
    assert!(r.resolve_wants(Duration::from_secs(2)).await);
    assert!(matches!(r.cache().schema(1, now_ms()), Known::Found(_)));
}

#[tokio::test]
async fn while_the_registry_is_down_responses_wait_less() {
    let broken: Handler = Arc::new(|_, _| (503, "{}".into(), 0));
    let (url, _) = stub(broken).await;
    let r = registry(&[&url], 2000);
    assert_eq!(r.wait(), Duration::from_millis(2000));
    assert!(!r.fetch_once(Want::Schema(1)).await);
    assert_eq!(r.wait(), DOWN_WAIT);
}

/// Apicurio's native API: content by global id, the type from a version
/// search, a reference read by group/artifact/version; an unknown content
/// id is stored as "no such id" in its own namespace.
#[tokio::test]
async fn apicurio_ids_resolve_through_the_native_api() {
    use crate::policy::registry::ApicurioId;
    let loc = r#"{"type":"record","name":"Location","namespace":"geo","fields":[{"name":"lat","type":"double"}]}"#;
    let main = r#"{"type":"record","name":"T","namespace":"geo","fields":[{"name":"at","type":"geo.Location"}]}"#;
    let handler: Handler = Arc::new(move |path, _| {
        let v3 = "/apis/registry/v3";
        let body = match path.strip_prefix(v3).unwrap_or("") {
            "/ids/globalIds/2" => main.to_string(),
            "/search/versions?globalId=2&limit=1" => {
                r#"{"count":1,"versions":[{"artifactType":"AVRO","globalId":2}]}"#.to_string()
            }
            "/ids/globalIds/2/references" => {
                r#"[{"artifactId":"loc","version":"1","name":"geo.Location"}]"#.to_string()
            }
            "/groups/default/artifacts/loc/versions/1/content" => loc.to_string(),
            "/groups/default/artifacts/loc/versions/1/references" => "[]".to_string(),
            _ => return (404, "{}".into(), 0),
        };
        (200, body, 0)
    });
    let (base, _) = stub(handler).await;
    let r = registry(&[&format!("{base}/apis/ccompat/v7")], 2000);
    assert!(r.fetch_once(Want::Apicurio(ApicurioId::Global, 2)).await);
    match r.cache().apicurio_schema(ApicurioId::Global, 2, now_ms()) {
        Known::Found(s) => assert!(
            matches!(*s, Registered::Avro(_, ref named) if named.len() == 1),
            "{s:?}"
        ),
        other => panic!("{other:?}"),
    }
    // The same number in the other namespaces is not this schema.
    assert!(!r
        .cache()
        .has(Want::Apicurio(ApicurioId::Content, 2), now_ms()));
    assert!(!r.cache().has(Want::Schema(2), now_ms()));
    assert!(r.fetch_once(Want::Apicurio(ApicurioId::Content, 9)).await);
    assert!(matches!(
        r.cache().apicurio_schema(ApicurioId::Content, 9, now_ms()),
        Known::NotFound
    ));
}
