//! Answers that name brokers (Metadata, FindCoordinator, DescribeCluster;
//! the NodeEndpoints of Produce, Fetch and share answers): every broker
//! address becomes the proxy's listener for that node, and what the answer
//! taught (brokers, topic ids) is learnt before it is
//! released, so a listener is open before a client can know its port.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;

use super::passthrough::Passthrough;
use super::{bad, Answer, Classified, Context, Cx, Exchange, Handling};
use crate::proxy::addresses::{self as rewrite, carries_addresses, Seen};
use crate::proxy::error::RelayError;
use crate::proxy::Shared;
use crate::transport::frame::{RequestHead, ResponseFrame};

/// The exchange of the keys whose answers carry addresses
/// (`proxy::addresses::carries_addresses`) and nothing else to change; of
/// any other key, [`Passthrough`].
pub(super) struct Addresses;

impl Exchange for Addresses {
    /// The key answered.
    type Call = ApiKey;

    fn request(frame: &Bytes, head: RequestHead, cx: &Context) -> Result<Classified, RelayError> {
        match ApiKey::try_from(head.api_key) {
            Ok(key) if carries_addresses(key, head.api_version) => {
                Ok(Classified::answered(head, Handling::Addresses(key)))
            }
            _ => Passthrough::request(frame, head, cx),
        }
    }

    async fn respond(
        cx: Cx<'_>,
        key: ApiKey,
        version: i16,
        frame: Bytes,
    ) -> Result<ResponseFrame, RelayError> {
        let answer = Answer::of(frame, key, version)?;
        let body = rewrite_addresses(cx.shared, key, version, answer.body()).await?;
        Ok(answer.with(body))
    }
}

/// `body` (an answer to `key`) with its broker addresses the proxy's, and
/// what it named learnt; `None` if nothing changed.
pub(super) async fn rewrite_addresses(
    shared: &Arc<Shared>,
    key: ApiKey,
    version: i16,
    body: Bytes,
) -> Result<Option<Bytes>, RelayError> {
    let mut seen = Seen::default();
    let rewritten =
        rewrite::rewrite_body(key, version, body, &shared.addrs, &mut seen).map_err(bad)?;
    shared.learn(seen).await;
    Ok(rewritten.map(bytes::BytesMut::freeze))
}
