//! The standard `process_*` metrics of the daemon itself, read from `/proc/self` at each scrape
//! (prometheus-client has no process collector).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// What `/proc/self` says about this process; a field that could not be read is `None` and
/// its metric is left out of the scrape.
#[derive(Debug, Default, PartialEq)]
pub struct ProcessStats {
    pub resident_bytes: Option<f64>,
    pub virtual_bytes: Option<f64>,
    pub cpu_seconds: Option<f64>,
    pub start_time_seconds: Option<f64>,
    pub open_fds: Option<f64>,
    pub max_fds: Option<f64>,
}

impl ProcessStats {
    pub fn read() -> Self {
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        let status = std::fs::read_to_string("/proc/self/status").ok();
        let limits = std::fs::read_to_string("/proc/self/limits").ok();
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| boot_time(&s));
        let ticks = clock_ticks();
        let times = stat.as_deref().and_then(stat_times);
        let open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|dir| dir.count() as f64);
        Self {
            resident_bytes: status.as_deref().and_then(|s| status_kib(s, "VmRSS:")),
            virtual_bytes: status.as_deref().and_then(|s| status_kib(s, "VmSize:")),
            cpu_seconds: times.map(|t| (t.utime + t.stime) as f64 / ticks),
            start_time_seconds: times
                .zip(boot)
                .map(|(t, boot)| boot as f64 + t.start as f64 / ticks),
            open_fds,
            max_fds: limits.as_deref().and_then(max_open_files),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct StatTimes {
    utime: u64,
    stime: u64,
    /// Clock ticks after boot.
    start: u64,
}

/// utime, stime and starttime of `/proc/<pid>/stat` (fields 14, 15, 22). The command name
/// (field 2) may hold spaces and parentheses, so fields are counted after its last `)`.
fn stat_times(stat: &str) -> Option<StatTimes> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse().ok();
    Some(StatTimes {
        utime: field(14)?,
        stime: field(15)?,
        start: field(22)?,
    })
}

/// A `VmRSS:   1234 kB` line of `/proc/<pid>/status`, in bytes.
fn status_kib(status: &str, key: &str) -> Option<f64> {
    let line = status.lines().find_map(|l| l.strip_prefix(key))?;
    let kib: f64 = line.split_whitespace().next()?.parse().ok()?;
    Some(kib * 1024.0)
}

/// The soft limit of `Max open files` in `/proc/<pid>/limits`.
fn max_open_files(limits: &str) -> Option<f64> {
    let line = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?;
    line.split_whitespace().next()?.parse().ok()
}

/// `btime` of `/proc/stat`: boot time in seconds since the epoch.
fn boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf reads a constant of the C library; it has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

#[derive(Debug)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = ProcessStats::read();
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                stats.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                stats.virtual_bytes,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch in seconds",
                stats.start_time_seconds,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                stats.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                stats.max_fds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(value) = value {
                let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
                ConstGauge::new(value).encode(metric)?;
            }
        }
        if let Some(cpu) = stats.cpu_seconds {
            let metric = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                MetricType::Counter,
            )?;
            ConstCounter::new(cpu).encode(metric)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 \
                    3 0 123456 1000000 500 18446744073709551615";
        assert_eq!(
            stat_times(stat),
            Some(StatTimes {
                utime: 250,
                stime: 50,
                start: 123456
            })
        );
        assert_eq!(stat_times("garbage"), None);
    }

    #[test]
    fn proc_files_are_parsed() {
        assert_eq!(
            status_kib("Name:\tx\nVmSize:\t  2048 kB\nVmRSS:\t 100 kB\n", "VmRSS:"),
            Some(102_400.0)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(max_open_files(limits), Some(1024.0));
        assert_eq!(
            boot_time("cpu 1 2 3\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
    }

    #[test]
    fn this_process_is_read() {
        let stats = ProcessStats::read();
        assert!(stats.resident_bytes.is_some_and(|b| b > 0.0), "{stats:?}");
        assert!(stats.open_fds.is_some_and(|n| n >= 1.0), "{stats:?}");
        assert!(stats.max_fds.is_some_and(|n| n >= 1.0), "{stats:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        let started = stats.start_time_seconds.unwrap_or_default();
        assert!(
            started > now - 3600.0 && started <= now + 1.0,
            "{started} vs {now}"
        );
    }
}
