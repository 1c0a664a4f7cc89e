//! The operator commands besides `run`: `antidote dlt ...` over the
//! dead-letter topics ([`dlt`]). `main.rs` parses the command line and
//! calls them; nothing in the proxy's runtime depends on this module.

pub mod dlt;
