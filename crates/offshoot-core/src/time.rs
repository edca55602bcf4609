//! Timestamps are Unix nanoseconds (`i64`) everywhere inside Offshoot. Server clocks are
//! rounded to microseconds so the legacy dialect (RFC 3339, six digits) and the v2 dialect
//! (nanoseconds) show the same instant.

use chrono::{DateTime, Utc};

pub type Ts = i64;

pub fn now() -> Ts {
    let ns = Utc::now().timestamp_nanos_opt().unwrap_or(0);
    ns - ns.rem_euclid(1_000)
}

/// RFC 3339 with as many fractional digits as the instant needs (at least 6).
pub fn to_rfc3339(ts: Ts) -> String {
    Rfc3339::new(ts).as_str().to_string()
}

/// [`to_rfc3339`]'s text, written on the stack: a Query Channels page writes thousands of
/// timestamps, and formatting each into a `String` of its own was a tenth of its rendering
/// (docs/performance.md, "Query Channels").
pub struct Rfc3339 {
    buf: [u8; 30],
    len: usize,
}

impl Rfc3339 {
    pub fn new(ts: Ts) -> Self {
        use chrono::{Datelike, Timelike};
        let dt = DateTime::<Utc>::from_timestamp_nanos(ts);
        let nanos = ts.rem_euclid(1_000_000_000) as u32;
        let mut buf = [0u8; 30];
        let mut put = |at: usize, value: u32, digits: usize| {
            let mut v = value;
            for i in (0..digits).rev() {
                buf[at + i] = b'0' + (v % 10) as u8;
                v /= 10;
            }
        };
        // `i64` nanoseconds span the years 1677 to 2262: always four digits.
        put(0, dt.year() as u32, 4);
        put(5, dt.month(), 2);
        put(8, dt.day(), 2);
        put(11, dt.hour(), 2);
        put(14, dt.minute(), 2);
        put(17, dt.second(), 2);
        let len = if nanos.is_multiple_of(1_000) {
            put(20, nanos / 1_000, 6);
            27
        } else {
            put(20, nanos, 9);
            30
        };
        for (at, sep) in [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':'), (19, b'.')] {
            buf[at] = sep;
        }
        buf[len - 1] = b'Z';
        Rfc3339 { buf, len }
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

/// Parses an RFC 3339 string, or a number / digit string of Unix nanoseconds.
pub fn parse(value: &serde_json::Value) -> Option<Ts> {
    match value {
        serde_json::Value::String(s) => parse_str(s),
        serde_json::Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

pub fn parse_str(s: &str) -> Option<Ts> {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().ok();
    }
    let dt = DateTime::parse_from_rfc3339(s).ok().or_else(|| DateTime::parse_from_rfc3339(&format!("{s}Z")).ok())?;
    dt.with_timezone(&Utc).timestamp_nanos_opt()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::SecondsFormat;

    #[test]
    fn rfc3339_round_trips_microseconds_and_nanoseconds() {
        for ts in [1_704_067_200_123_456_000, 1_704_067_200_123_456_789] {
            assert_eq!(parse_str(&to_rfc3339(ts)), Some(ts));
        }
        assert_eq!(to_rfc3339(1_704_067_200_123_456_000), "2024-01-01T00:00:00.123456Z");
    }

    /// The text written on the stack is chrono's, across the range of `i64` nanoseconds.
    #[test]
    fn rfc3339_is_written_as_chrono_writes_it() {
        let mut samples = vec![i64::MIN, i64::MAX, 0, -1, -1_000, 1, 999, 1_000, 1_704_067_200_123_456_000, 1_704_067_200_123_456_789];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            samples.push(x as i64);
            samples.push((x as i64) / 1_000 * 1_000);
        }
        for ts in samples {
            let dt = DateTime::<Utc>::from_timestamp_nanos(ts);
            let format = if ts.rem_euclid(1_000) == 0 { SecondsFormat::Micros } else { SecondsFormat::Nanos };
            assert_eq!(Rfc3339::new(ts).as_str(), dt.to_rfc3339_opts(format, true), "{ts}");
        }
    }

    #[test]
    fn naive_strings_and_digit_strings_parse() {
        assert_eq!(parse_str("2024-01-01T00:00:00"), Some(1_704_067_200_000_000_000));
        assert_eq!(parse_str("1704067200000000000"), Some(1_704_067_200_000_000_000));
        assert_eq!(parse_str("yesterday"), None);
    }
}
