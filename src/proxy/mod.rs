//! The network hop: listeners, per-connection request/response relay,
//! address rewriting, API version negotiation and TLS.
