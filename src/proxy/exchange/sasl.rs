//! SaslHandshake: the number of raw SASL tokens its request announces
//! (`proxy::sasl_phase`), which follow the answer only when the broker
//! accepts a v0 handshake; the answer itself passes unchanged.

use bytes::Bytes;

use super::{Classified, Context, Cx, Exchange, Handling};
use crate::proxy::error::RelayError;
use crate::proxy::sasl_phase::{self, Tokens};
use crate::transport::frame::{RequestHead, ResponseFrame};

pub(super) struct Handshake;

impl Exchange for Handshake {
    /// The tokens the request announced.
    type Call = Tokens;

    fn request(frame: &Bytes, head: RequestHead, cx: &Context) -> Result<Classified, RelayError> {
        let tokens = sasl_phase::handshake(frame, head.api_version, cx.policies_loaded)?;
        Ok(Classified::answered(head, Handling::SaslHandshake(tokens)))
    }

    async fn respond(
        cx: Cx<'_>,
        tokens: Tokens,
        version: i16,
        frame: Bytes,
    ) -> Result<ResponseFrame, RelayError> {
        cx.sasl.handshake_answered(tokens, version, &frame);
        Ok(ResponseFrame::whole(frame))
    }
}
