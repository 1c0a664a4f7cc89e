//! Answers that name brokers (Metadata, FindCoordinator, DescribeCluster,
//! ...): every broker address becomes the proxy's listener for that node,
//! and what the answer taught (brokers, topic ids) is learnt before it is
//! released, so a listener is open before a client can know its port.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;

use super::{bad, Answer, Cx};
use crate::proxy::addresses::{self as rewrite, Seen};
use crate::proxy::error::RelayError;
use crate::proxy::Shared;
use crate::transport::frame::ResponseFrame;

pub(super) async fn respond(
    cx: Cx<'_>,
    key: ApiKey,
    version: i16,
    frame: Bytes,
) -> Result<ResponseFrame, RelayError> {
    let answer = Answer::of(frame, key, version)?;
    let body = rewrite_addresses(cx.shared, key, version, answer.body()).await?;
    Ok(answer.with(body))
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
