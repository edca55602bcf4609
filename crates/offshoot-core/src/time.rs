//! Timestamps are Unix nanoseconds (`i64`) everywhere inside Offshoot. Server clocks are
//! rounded to microseconds so the legacy dialect (RFC 3339, six digits) and the v2 dialect
//! (nanoseconds) show the same instant.

use chrono::{DateTime, SecondsFormat, Utc};

pub type Ts = i64;

pub fn now() -> Ts {
    let ns = Utc::now().timestamp_nanos_opt().unwrap_or(0);
    ns - ns.rem_euclid(1_000)
}

/// RFC 3339 with as many fractional digits as the instant needs (at least 6).
pub fn to_rfc3339(ts: Ts) -> String {
    let dt = DateTime::<Utc>::from_timestamp_nanos(ts);
    if ts.rem_euclid(1_000) == 0 {
        dt.to_rfc3339_opts(SecondsFormat::Micros, true)
    } else {
        dt.to_rfc3339_opts(SecondsFormat::Nanos, true)
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

    #[test]
    fn rfc3339_round_trips_microseconds_and_nanoseconds() {
        for ts in [1_704_067_200_123_456_000, 1_704_067_200_123_456_789] {
            assert_eq!(parse_str(&to_rfc3339(ts)), Some(ts));
        }
        assert_eq!(to_rfc3339(1_704_067_200_123_456_000), "2024-01-01T00:00:00.123456Z");
    }

    #[test]
    fn naive_strings_and_digit_strings_parse() {
        assert_eq!(parse_str("2024-01-01T00:00:00"), Some(1_704_067_200_000_000_000));
        assert_eq!(parse_str("1704067200000000000"), Some(1_704_067_200_000_000_000));
        assert_eq!(parse_str("yesterday"), None);
    }
}
