//! How the daemon runs: what `leash daemon`'s options set.

use std::{
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
    str::FromStr,
    time::Duration,
};

use super::limits::UidLimits;
use crate::kernel::Capacity;

/// How the daemon runs.
#[derive(Clone, Debug)]
pub struct Config {
    pub socket: PathBuf,
    pub capacity: Capacity,
    /// Grace period of trees that do not set one.
    pub default_grace: Duration,
    /// Trees a non-root uid may hold at once.
    pub max_trees_per_uid: usize,
    /// Connections and request rate a non-root uid may have.
    pub uid_limits: UidLimits,
    /// Where the programs and maps are pinned (a directory on bpffs), so that tracking goes on
    /// while the daemon is away and the next one takes over. None: not pinned.
    pub pin_root: Option<PathBuf>,
    /// Where the metrics are served, if anywhere.
    pub metrics: Option<MetricsAddr>,
    /// The group that may connect to a metrics Unix socket, besides root.
    pub metrics_group: Option<u32>,
}

/// Where the metrics are served: `--metrics ADDR`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetricsAddr {
    /// A Unix socket at this absolute path.
    Unix(PathBuf),
    /// A loopback TCP address.
    Tcp(SocketAddr),
}

impl FromStr for MetricsAddr {
    type Err = String;

    fn from_str(addr: &str) -> Result<Self, String> {
        if addr.starts_with('/') {
            return Ok(Self::Unix(PathBuf::from(addr)));
        }
        match addr.parse::<SocketAddr>() {
            Ok(tcp) if tcp.ip().is_loopback() => Ok(Self::Tcp(tcp)),
            Ok(tcp) => Err(format!(
                "{tcp} is not a loopback address: the metrics endpoint has no authentication, \
                 so it listens only on 127.0.0.1, [::1] or a Unix socket; let a scraper on this \
                 machine (a Prometheus agent, or a proxy) carry the figures further"
            )),
            Err(_) => Err(format!(
                "{addr:?} is neither an absolute path (a Unix socket, e.g. \
                 /run/leash/metrics.sock) nor a loopback IP address with a port (e.g. \
                 127.0.0.1:9464 or [::1]:9464)"
            )),
        }
    }
}

impl fmt::Display for MetricsAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "{}", path.display()),
            Self::Tcp(addr) => write!(f, "{addr}"),
        }
    }
}

impl MetricsAddr {
    /// The socket file, for a Unix socket: the daemon removes it when it stops.
    pub fn socket_path(&self) -> Option<&Path> {
        match self {
            Self::Unix(path) => Some(path),
            Self::Tcp(_) => None,
        }
    }
}
