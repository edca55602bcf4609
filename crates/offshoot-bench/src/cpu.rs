//! The machine's CPU over a figure's measurement, from `/proc/stat`: how busy its cores were and
//! how much of their time the host took for other guests ("steal", on a virtual machine). The
//! same code gave figures apart by a factor of ten from one hour to the next on these machines
//! (docs/performance.md, "Measuring on shared two-core machines"); a figure printed with the steal beside it says which part of that is the
//! machine. Prints nothing where `/proc/stat` cannot be read.

/// The cores' time so far, in the kernel's ticks, summed over all cores.
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    busy: u64,
    steal: u64,
    total: u64,
}

impl Mark {
    /// The time so far (`None` where `/proc/stat` cannot be read).
    pub fn now() -> Option<Mark> {
        parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }
}

/// The aggregate `cpu` line: user nice system idle iowait irq softirq steal (guest time is
/// already counted in user).
fn parse(stat: &str) -> Option<Mark> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).take(8).map(str::parse).collect::<Result<_, _>>().ok()?;
    let [user, nice, system, idle, iowait, irq, softirq, steal] = v.try_into().ok()?;
    Some(Mark { busy: user + nice + system + irq + softirq, steal, total: user + nice + system + idle + iowait + irq + softirq + steal })
}

/// The cores' use between `from` and now (`None` without a reading).
pub fn since(from: Option<Mark>) -> Option<Usage> {
    between(from?, Mark::now()?)
}

/// Shares of the cores' time over a window, in per cent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    busy: f64,
    stolen: f64,
}

fn between(a: Mark, b: Mark) -> Option<Usage> {
    let total = b.total.saturating_sub(a.total);
    let share = |x: u64, y: u64| 100.0 * y.saturating_sub(x) as f64 / total as f64;
    (total > 0).then(|| Usage { busy: share(a.busy, b.busy), stolen: share(a.steal, b.steal) })
}

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "machine {:.0} % busy, {:.0} % stolen", self.busy, self.stolen)
    }
}

/// `usage` after `sep` (`"; machine 48 % busy, 6 % stolen"`), or nothing without a reading.
pub fn note(sep: &str, usage: Option<Usage>) -> String {
    usage.map(|u| format!("{sep}{u}")).unwrap_or_default()
}

/// The time one core takes for a fixed piece of work of the server's kind (a page of messages
/// written as JSON and read back): the best of five tries, so the least disturbed. The host can
/// slow its guests without stealing their time (a neighbour on the same caches and memory), and
/// a figure that moved between two runs is then set against this.
pub fn speed_check() -> std::time::Duration {
    let page: Vec<serde_json::Value> = (0..1_000)
        .map(|i| {
            serde_json::json!({
                "id": format!("message-{i}"),
                "text": "an agent's answer, a few words long, ".repeat(10),
                "user": {"id": "agent", "name": "Agent", "role": "user"},
                "custom": {"model": "m", "usage": {"tokens": i}},
                "created_at": "2026-12-06T09:00:00.000000Z",
            })
        })
        .collect();
    (0..5)
        .map(|_| {
            let started = std::time::Instant::now();
            for _ in 0..40 {
                let text = serde_json::to_string(std::hint::black_box(&page)).expect("serialise");
                let back: serde_json::Value = serde_json::from_str(&text).expect("parse");
                std::hint::black_box(back);
            }
            started.elapsed()
        })
        .min()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_of_the_window_between_two_readings() {
        let a = parse("cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n").expect("a");
        let b = parse("cpu  160 0 70 850 10 5 5 100 0 0\n").expect("b");
        // 200 ticks: 90 busy (60 user, 20 system, 5 irq, 5 softirq), 60 stolen, 50 idle.
        let u = between(a, b).expect("a window");
        assert_eq!(u, Usage { busy: 45.0, stolen: 30.0 });
        assert_eq!(note("; ", Some(u)), "; machine 45 % busy, 30 % stolen");
        assert_eq!(between(b, b), None);
        assert_eq!(note("; ", None), "");
        assert!(parse("intr 1 2 3\n").is_none());
    }
}
