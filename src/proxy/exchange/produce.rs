//! Produce: the partitions the proxy refused itself (writes to a
//! dead-letter topic, batches refused at the door) are merged into the
//! broker's answer for the rest, so the producer gets one answer per
//! partition it sent; v10+ answers' NodeEndpoints are rewritten.

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;

use super::addresses::rewrite_addresses;
use super::{bad, Answer, Cx};
use crate::intercept::produce::wire as produce;
use crate::proxy::addresses::carries_addresses;
use crate::proxy::error::RelayError;
use crate::transport::frame::ResponseFrame;

pub(super) async fn respond(
    cx: Cx<'_>,
    refused: &produce::Refused,
    version: i16,
    frame: Bytes,
) -> Result<ResponseFrame, RelayError> {
    let key = ApiKey::Produce;
    let answer = Answer::of(frame, key, version)?;
    let body = produce::merge(answer.body(), version, refused)
        .map_err(bad)?
        .freeze();
    let body = match carries_addresses(key, version) {
        true => rewrite_addresses(cx.shared, key, version, body.clone())
            .await?
            .unwrap_or(body),
        false => body,
    };
    Ok(answer.with(Some(body)))
}
