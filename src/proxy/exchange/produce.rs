//! Produce: while client writes to dead-letter topics are refused or a
//! policy judges Produce (`on_produce: reject`), the request is checked
//! (`intercept::produce`) and the partitions the proxy refuses never reach
//! the broker; their answers are merged into the broker's answer for the
//! rest, so the producer gets one answer per partition it sent. v10+
//! answers' NodeEndpoints are rewritten. An acks=0 Produce expects no
//! answer; one refused in part closes the connection, as Kafka does.

mod guard;

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;

pub(in crate::proxy) use guard::{learn_topic_ids, ProduceGuard};

use super::addresses::{rewrite_addresses, Addresses};
use super::{bad, Answer, Classified, Context, Cx, Exchange, Handling, Pending, Send};
use crate::intercept::produce::wire as produce;
use crate::proxy::addresses::carries_addresses;
use crate::proxy::error::RelayError;
use crate::transport::frame::{self, response_frame, Cursor, RequestHead, ResponseFrame};

pub(super) struct Produce;

impl Exchange for Produce {
    /// The partitions the proxy refused, answered by it.
    type Call = produce::Refused;

    fn request(frame: &Bytes, head: RequestHead, cx: &Context) -> Result<Classified, RelayError> {
        let v = head.api_version;
        let decision = match cx.produce_guard {
            Some(t) => {
                produce::check(frame, v, t).map_err(|e| RelayError::BadRequest(e.to_string()))?
            }
            None => produce::Decision::Untouched,
        };
        let pending = |handling| Some(Pending::of(head, handling));
        Ok(match decision {
            produce::Decision::Untouched => match acks(frame, v) {
                Some(0) => Classified::forward(None),
                _ => Addresses::request(frame, head, cx)?,
            },
            produce::Decision::Split {
                request,
                refused,
                acks,
            } => Classified {
                pending: if acks == 0 {
                    None
                } else {
                    pending(Handling::Produce(refused))
                },
                send: Send::Replaced(request),
                close: acks == 0,
                inject: None,
            },
            produce::Decision::AllRefused { body } => Classified {
                close: body.is_none(),
                pending: body.and_then(|b| {
                    let tags = super::response_tags(ApiKey::Produce, v);
                    pending(Handling::Local(response_frame(
                        head.correlation_id,
                        tags,
                        &b,
                    )))
                }),
                send: Send::Nothing,
                inject: None,
            },
        })
    }

    async fn respond(
        cx: Cx<'_>,
        refused: produce::Refused,
        version: i16,
        frame: Bytes,
    ) -> Result<ResponseFrame, RelayError> {
        let key = ApiKey::Produce;
        let answer = Answer::of(frame, key, version)?;
        let body = produce::merge(answer.body(), version, &refused)
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
}

/// The `acks` field of a Produce request, found by hand so that produce
/// traffic is never decoded.
pub(super) fn acks(frame: &[u8], version: i16) -> Option<i16> {
    let flexible = ApiKey::Produce.request_header_version(version) >= 2;
    let mut r = Cursor::new(frame, frame::request_body_offset(frame, flexible)?);
    if version >= 3 {
        r.skip_nullable_string(version >= 9)?; // transactional_id
    }
    r.i16()
}

#[cfg(test)]
mod tests {
    #[test]
    fn acks_is_read_by_hand_at_every_version() {
        let request = |version: i16, body: &[u8]| {
            let mut b = vec![0, 0];
            b.extend_from_slice(&version.to_be_bytes());
            b.extend_from_slice(&7i32.to_be_bytes());
            b.extend_from_slice(&(-1i16).to_be_bytes()); // null client id
            if version >= 9 {
                b.push(0); // no tagged fields in the flexible header
            }
            b.extend_from_slice(body);
            crate::transport::frame::with_length_prefix(&b)
        };
        assert_eq!(super::acks(&request(2, &[0, 1]), 2), Some(1));
        // v3: transactional_id null (-1), acks 0
        assert_eq!(super::acks(&request(3, &[0xff, 0xff, 0, 0]), 3), Some(0));
        // v9 (flexible): compact null transactional id (0), acks -1
        assert_eq!(super::acks(&request(9, &[0, 0xff, 0xff]), 9), Some(-1));
    }
}
