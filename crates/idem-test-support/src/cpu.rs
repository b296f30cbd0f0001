//! CPU time, for benches that report CPU per request.

use std::time::Duration;

/// A process's user + system CPU time so far, from `/proc/PID/stat` (`pid` "self" for
/// this process); zero where there is no `/proc`.
pub fn cpu_time(pid: &str) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // After the parenthesised command name, utime and stime are the 12th and 13th
    // fields, in clock ticks (100 per second on Linux).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spinning shows up as CPU time, however long a loaded machine takes to give the
    /// spin its first tick.
    #[test]
    fn spinning_is_counted() {
        if !std::path::Path::new("/proc/self/stat").exists() {
            return;
        }
        let before = cpu_time("self");
        let start = std::time::Instant::now();
        let mut spin = 0u64;
        while cpu_time("self") <= before {
            spin = std::hint::black_box(spin.wrapping_add(1));
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "a minute of spinning was not counted"
            );
        }
    }
}
