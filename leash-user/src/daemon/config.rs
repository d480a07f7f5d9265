//! How the daemon runs: what `leash daemon`'s options set.

use std::{path::PathBuf, time::Duration};

use super::{limits::UidLimits, metrics_http::MetricsAddr};
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
