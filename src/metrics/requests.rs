//! Client requests by API and version: which protocol versions the clients
//! behind the proxy speak, to see before a broker or client upgrade what
//! will change, and to see a version cap (ApiVersions) take effect.
//!
//! One series per API key and version the clients use (at most the ~100
//! keys Kafka defines times their versions); the API's name is written only
//! when the registry is scraped, so counting is a read lock and an add.

use std::fmt::Write;

use kafka_protocol::messages::ApiKey;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::series::register;

pub const CLIENT_REQUESTS: &str = "antidote_client_requests_total";

/// An API key, labelled by its name in Kafka's protocol (`Produce`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct ApiName(ApiKey);

impl EncodeLabelValue for ApiName {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        write!(encoder, "{:?}", self.0)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    api: ApiName,
    version: i16,
}

/// The series of this module.
#[derive(Default)]
pub struct RequestMetrics {
    total: Family<RequestLabels, Counter>,
}

impl RequestMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        register(
            r,
            CLIENT_REQUESTS,
            "Client requests read by the proxy, by API and version (answered by the broker or by the proxy itself).",
            self.total.clone(),
        );
    }

    /// A client request of `api_key` at `version`; keys Kafka does not
    /// define are not counted (the proxy refuses them). The version is the
    /// client's to choose (any i16): one this build does not know is
    /// counted as -1, so a client trying every version adds one series per
    /// key, not 65,536.
    ///
    /// Call site: `proxy::relay`'s request pump, once per request.
    pub fn request(&self, api_key: i16, version: i16) {
        if let Ok(key) = ApiKey::try_from(api_key) {
            let known = (0..=key.valid_versions().max).contains(&version);
            self.total
                .get_or_create(&RequestLabels {
                    api: ApiName(key),
                    version: if known { version } else { -1 },
                })
                .inc();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn requests_are_labelled_by_api_name_and_version_and_unknown_keys_are_not_counted() {
        let m = super::super::Metrics::new();
        m.requests.request(0, 13);
        m.requests.request(0, 13);
        m.requests.request(18, 5);
        m.requests.request(9999, 1);
        m.requests.request(1, 19);
        m.requests.request(1, i16::MAX);
        m.requests.request(1, -7);
        let out = m.render();
        assert!(
            out.contains(r#"antidote_client_requests_total{api="Produce",version="13"} 2"#),
            "{out}"
        );
        assert!(
            out.contains(r#"antidote_client_requests_total{api="ApiVersions",version="5"} 1"#),
            "{out}"
        );
        assert!(!out.contains("9999"), "{out}");
        assert!(
            out.contains(r#"antidote_client_requests_total{api="Fetch",version="-1"} 3"#),
            "{out}"
        );
    }
}
