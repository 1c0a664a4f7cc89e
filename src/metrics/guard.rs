//! [`ConnectionGuard`]: a client connection counted while it lives.

use std::sync::Arc;

use super::Metrics;

/// Counts one open connection of a listener for as long as it lives:
/// `+1` when made, `-1` when dropped, whichever way the connection ends.
///
/// Call site: `proxy::serve`, first line:
/// `let _open = ConnectionGuard::new(metrics::global().clone(), listener_name);`
pub struct ConnectionGuard {
    metrics: Arc<Metrics>,
    listener: String,
}

impl ConnectionGuard {
    pub fn new(metrics: Arc<Metrics>, listener: impl Into<String>) -> Self {
        let listener = listener.into();
        metrics.connections_open(&listener, 1);
        ConnectionGuard { metrics, listener }
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.metrics.connections_open(&self.listener, -1);
    }
}
