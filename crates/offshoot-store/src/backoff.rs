//! Pauses before trying again, with random jitter so that the writers or jobs that failed
//! together do not try again together: the store's retried transactions and the worker's
//! retried jobs and webhook circuits.

use std::time::Duration;

/// `d` plus a uniformly random part of at most `spread` (whole milliseconds).
pub fn jittered(d: Duration, spread: Duration) -> Duration {
    d + Duration::from_millis(fastrand::u64(0..=spread.as_millis() as u64))
}

/// The pause before attempt `failed + 1`: `base` doubled for each failure after the first, at
/// most `max`, jittered to between half and all of that.
pub fn backoff(base: Duration, max: Duration, failed: u32) -> Duration {
    let exp = base.saturating_mul(1u32 << failed.saturating_sub(1).min(20)).min(max);
    let half = exp / 2;
    jittered(half, half)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_base_up_to_the_cap_with_jitter_in_the_upper_half() {
        let (base, max) = (Duration::from_secs(2), Duration::from_secs(60));
        for (failed, full) in [(1, 2), (2, 4), (3, 8), (5, 32), (6, 60), (40, 60)] {
            for _ in 0..50 {
                let d = backoff(base, max, failed);
                let full = Duration::from_secs(full);
                assert!(d >= full / 2 && d <= full, "attempt {failed}: {d:?} not within [{:?}, {full:?}]", full / 2);
            }
        }
    }

    #[test]
    fn jitter_stays_within_its_spread_and_varies() {
        let (d, spread) = (Duration::from_millis(10), Duration::from_millis(19));
        let pauses: std::collections::HashSet<Duration> = (0..200).map(|_| jittered(d, spread)).collect();
        assert!(pauses.iter().all(|p| *p >= d && *p <= d + spread), "{pauses:?}");
        assert!(pauses.len() > 1, "random: {pauses:?}");
    }
}
