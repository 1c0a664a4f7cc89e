//! ApiVersions: the broker's versions intersected with what the proxy
//! offers (`proxy::versions`), so a client never picks a version antidote
//! cannot handle; a request newer than the proxy knows is answered
//! locally (v0, UNSUPPORTED_VERSION, as KIP-511 asks), and the broker's
//! share versions are learnt for the connection's renewals.

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;

use super::{bad, Classified, Context, Cx, Exchange, Handling};
use crate::proxy::error::RelayError;
use crate::proxy::versions;
use crate::transport::frame::{
    response_frame, RequestHead, ResponseFrame, LENGTH_PREFIX, RESPONSE_ID_END,
};

pub(super) struct ApiVersions;

impl Exchange for ApiVersions {
    type Call = ();

    fn request(_: &Bytes, head: RequestHead, _: &Context) -> Result<Classified, RelayError> {
        let handling = if head.api_version > versions::max_api_versions_version() {
            let body = versions::unsupported_version_body()
                .map_err(|e| RelayError::BadRequest(e.to_string()))?;
            Handling::Local(response_frame(head.correlation_id, &[], &body))
        } else {
            Handling::ApiVersions
        };
        Ok(Classified::answered(head, handling))
    }

    async fn respond(
        cx: Cx<'_>,
        _: (),
        version: i16,
        frame: Bytes,
    ) -> Result<ResponseFrame, RelayError> {
        let share_ack = versions::broker_max(&frame, version, ApiKey::ShareAcknowledge);
        cx.share.learn_versions(share_ack);
        // The ApiVersions response header is always v0: the correlation id alone.
        let offer = cx.shared.offer;
        let body =
            versions::rewrite(frame.slice(RESPONSE_ID_END..), version, offer).map_err(bad)?;
        Ok(ResponseFrame::new(
            &frame[LENGTH_PREFIX..RESPONSE_ID_END],
            Bytes::from(body),
        ))
    }
}
