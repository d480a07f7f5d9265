//! The daemon's own process, as Prometheus's standard `process_*` families name it (the names,
//! help texts and units of the Go and Python clients' process collectors), so the dashboards
//! and alerts written for them work on the daemon too.
//!
//! prometheus-client, the daemon's Prometheus library, has no process collector (its issue
//! #29 is open); the `prometheus` crate's `process` feature is another library's registry and
//! encoder. So the figures are read here, through procfs (the crate the daemon reads every
//! other process with, as the `prometheus` crate's collector does): /proc/self/stat, limits
//! and the descriptors in /proc/self/fd.

use procfs::{
    ProcResult,
    process::{LimitValue, Process},
};
use prometheus_client::{
    metrics::{counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};

/// The figures of one reading of /proc/self.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(in crate::daemon) struct ProcessFigures {
    /// User and system CPU time, in seconds.
    pub cpu_seconds: f64,
    pub open_fds: u64,
    /// The soft limit on open descriptors (RLIMIT_NOFILE); infinite when unlimited.
    pub max_fds: f64,
    pub virtual_memory_bytes: u64,
    pub resident_memory_bytes: u64,
    /// Since the Unix epoch.
    pub start_time_seconds: f64,
}

impl ProcessFigures {
    /// Reads them now: /proc/self/stat and /proc/self/limits, the entries of /proc/self/fd,
    /// and /proc/stat's boot time (read once per thread).
    pub(in crate::daemon) fn read() -> ProcResult<Self> {
        let me = Process::myself()?;
        let stat = me.stat()?;
        let ticks = procfs::ticks_per_second() as f64;
        let max_fds = match me.limits()?.max_open_files.soft_limit {
            LimitValue::Value(n) => n as f64,
            LimitValue::Unlimited => f64::INFINITY,
        };
        Ok(Self {
            cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
            open_fds: me.fd_count()? as u64,
            max_fds,
            virtual_memory_bytes: stat.vsize,
            resident_memory_bytes: stat.rss.saturating_mul(procfs::page_size()),
            // The start is in ticks since boot; boot is /proc/stat's btime, in seconds.
            start_time_seconds: procfs::boot_time_secs()? as f64 + stat.starttime as f64 / ticks,
        })
    }

    /// Registers the standard `process_*` families, with the Go and Python clients' help
    /// texts (the registry adds their final period).
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            ConstCounter::new(self.cpu_seconds),
        );
        registry.register(
            "process_open_fds",
            "Number of open file descriptors",
            ConstGauge::new(self.open_fds),
        );
        registry.register(
            "process_max_fds",
            "Maximum number of open file descriptors",
            ConstGauge::new(self.max_fds),
        );
        registry.register(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            ConstGauge::new(self.virtual_memory_bytes),
        );
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            ConstGauge::new(self.resident_memory_bytes),
        );
        registry.register(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            ConstGauge::new(self.start_time_seconds),
        );
    }
}
