//! ApiVersions: the broker's versions intersected with what the proxy
//! offers (`proxy::versions`), so a client never picks a version antidote
//! cannot handle.

use bytes::Bytes;

use super::{bad, Cx};
use crate::proxy::error::RelayError;
use crate::proxy::versions;
use crate::transport::frame::{ResponseFrame, LENGTH_PREFIX, RESPONSE_ID_END};

pub(super) fn respond(cx: Cx<'_>, version: i16, frame: Bytes) -> Result<ResponseFrame, RelayError> {
    // The ApiVersions response header is always v0: the correlation id alone.
    let offer = versions::Offer::of(&cx.shared.config);
    let body = versions::rewrite(frame.slice(RESPONSE_ID_END..), version, offer).map_err(bad)?;
    Ok(ResponseFrame::new(
        &frame[LENGTH_PREFIX..RESPONSE_ID_END],
        Bytes::from(body),
    ))
}
