//! Transport shared by the proxy's relay and its own client: Kafka frames
//! (`frame`), TCP and TLS streams behind one type (`net`), TLS setup
//! (`tls`), socket-to-socket moves of a frame's bytes (`splice`). Knows
//! nothing about what the frames mean.

pub mod frame;
pub mod net;
pub mod splice;
pub mod tls;
