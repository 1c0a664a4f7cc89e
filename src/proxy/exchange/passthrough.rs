//! The exchange of every key antidote does not change: the request and the
//! broker's answer forwarded as they came (also the proxy's own local
//! answers, whose frames the relay sends itself).

use bytes::Bytes;

use super::{Classified, Context, Cx, Exchange, Handling};
use crate::proxy::error::RelayError;
use crate::transport::frame::{RequestHead, ResponseFrame};

pub(super) struct Passthrough;

impl Exchange for Passthrough {
    type Call = ();

    fn request(_: &Bytes, head: RequestHead, _: &Context) -> Result<Classified, RelayError> {
        Ok(Classified::answered(head, Handling::Forward))
    }

    async fn respond(_: Cx<'_>, _: (), _: i16, frame: Bytes) -> Result<ResponseFrame, RelayError> {
        Ok(ResponseFrame::whole(frame))
    }
}
