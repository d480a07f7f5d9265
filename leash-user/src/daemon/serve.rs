//! The daemon's front: setting up each connection (identified, charged to its account, given a
//! lease), serving that lease until it ends, and the HTTP endpoint for Prometheus.

pub(super) mod connection;
pub(super) mod lease;
pub(super) mod metrics_http;
