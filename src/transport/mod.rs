//! Transport shared by the proxy's relay and its own client: Kafka frames
//! (`frame`), TCP and TLS streams behind one type (`net`), TLS setup
//! (`tls`). Knows nothing about what the frames mean.

pub mod frame;
pub mod net;
pub mod tls;
