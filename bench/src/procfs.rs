//! CPU time and memory of this process, one of its threads, or a child, from `/proc`.

use std::path::Path;

/// Clock ticks per second of `/proc/*/stat` times (`getconf CLK_TCK`; 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;

/// User + system CPU seconds of the task whose `stat` file is `path`.
fn cpu_from(path: &Path) -> Option<f64> {
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name (which may hold spaces) start at field 3 (state).
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / TICKS_PER_SECOND)
}

/// CPU seconds of the whole process (all threads, living and exited).
pub(crate) fn process_cpu() -> f64 {
    cpu_from(Path::new("/proc/self/stat")).unwrap_or(0.0)
}

/// CPU seconds of the calling thread.
pub(crate) fn thread_cpu() -> f64 {
    cpu_from(Path::new("/proc/thread-self/stat")).unwrap_or(0.0)
}

/// CPU seconds of process `pid` (0 when it is gone).
pub(crate) fn pid_cpu(pid: u32) -> f64 {
    cpu_from(Path::new(&format!("/proc/{pid}/stat"))).unwrap_or(0.0)
}

/// Resident and peak resident memory, in KiB.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Memory {
    /// `VmRSS`.
    pub(crate) rss_kib: u64,
    /// `VmHWM`: the peak of `VmRSS` since the process started.
    pub(crate) hwm_kib: u64,
}

fn memory_from(path: &Path) -> Memory {
    let Ok(status) = std::fs::read_to_string(path) else {
        return Memory::default();
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Memory {
        rss_kib: field("VmRSS:"),
        hwm_kib: field("VmHWM:"),
    }
}

/// Memory of this process.
pub(crate) fn memory() -> Memory {
    memory_from(Path::new("/proc/self/status"))
}

/// Memory of process `pid`.
pub(crate) fn pid_memory(pid: u32) -> Memory {
    memory_from(Path::new(&format!("/proc/{pid}/status")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        assert!(memory().rss_kib > 0);
        assert!(process_cpu() >= thread_cpu());
    }
}
