//! Fetch: while policies are loaded, the answer judged by the Fetch filter
//! (`intercept::fetch`): records of policy topics without the invalid ones
//! (diverted first), partitions held where something cannot be decided
//! now, written as the broker's bytes with only the changed records
//! sections replaced. With no policy, the addresses exchange's.

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;

use super::addresses::Addresses;
use super::{Answer, Classified, Context, Cx, Exchange, Handling};
use crate::proxy::error::RelayError;
use crate::transport::frame::{self, Cursor, RequestHead, ResponseFrame};

pub(super) struct Fetch;

impl Exchange for Fetch {
    /// The request's isolation level.
    type Call = i8;

    fn request(frame: &Bytes, head: RequestHead, cx: &Context) -> Result<Classified, RelayError> {
        if !cx.policies_loaded {
            return Addresses::request(frame, head, cx);
        }
        let isolation = isolation(frame, head.api_version)
            .ok_or_else(|| RelayError::BadRequest("truncated Fetch request".into()))?;
        Ok(Classified::answered(head, Handling::Fetch(isolation)))
    }

    async fn respond(
        cx: Cx<'_>,
        isolation: i8,
        version: i16,
        frame: Bytes,
    ) -> Result<ResponseFrame, RelayError> {
        let answer = Answer::of(frame, ApiKey::Fetch, version)?;
        let body = cx
            .shared
            .fetch_filter
            .filter(cx.shared, cx.holds, answer.body(), version, isolation)
            .await?;
        Ok(match body {
            Some(chunks) => ResponseFrame::chunks(answer.header(), chunks),
            None => answer.with(None),
        })
    }
}

/// The isolation level of a Fetch request (v4+), found by hand.
pub(super) fn isolation(frame: &[u8], version: i16) -> Option<i8> {
    let flexible = ApiKey::Fetch.request_header_version(version) >= 2;
    let mut r = Cursor::new(frame, frame::request_body_offset(frame, flexible)?);
    if version < 15 {
        r.i32()?; // replica_id (a tagged field from v15)
    }
    r.skip(12)?; // max_wait_ms, min_bytes, max_bytes
    if version >= 4 {
        r.i8()
    } else {
        Some(0)
    }
}
