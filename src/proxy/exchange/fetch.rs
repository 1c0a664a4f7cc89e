//! Fetch: the answer judged by the Fetch filter (`intercept::fetch`):
//! records of policy topics without the invalid ones (diverted first),
//! partitions held where something cannot be decided now, written as the
//! broker's bytes with only the changed records sections replaced.

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;

use super::{Answer, Cx};
use crate::proxy::error::RelayError;
use crate::transport::frame::ResponseFrame;

pub(super) async fn respond(
    cx: Cx<'_>,
    isolation: i8,
    version: i16,
    frame: Bytes,
) -> Result<ResponseFrame, RelayError> {
    let answer = Answer::of(frame, ApiKey::Fetch, version)?;
    let started = std::time::Instant::now();
    let body = cx
        .shared
        .fetch_filter
        .filter(cx.shared, cx.holds, answer.body(), version, isolation)
        .await?;
    crate::metrics::global().fetch_rewrite_latency(started.elapsed());
    Ok(match body {
        Some(chunks) => ResponseFrame::chunks(answer.header(), chunks),
        None => answer.with(None),
    })
}
