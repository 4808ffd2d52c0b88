//! Time as text and as numbers: the one duration parser (flags and the rotation config), the
//! one RFC 3339 formatter (logs, annotations, reports), the wall clock in Unix seconds, and
//! `--now`.

use std::time::Duration;

use crate::base::error::ConfigError;

/// Parses a duration: a whole number followed by a unit, or plain seconds. Surrounding
/// whitespace is ignored.
///
/// | unit | meaning |
/// |---|---|
/// | `ms` | milliseconds |
/// | none, `s` | seconds |
/// | `m` | minutes |
/// | `h` | hours |
/// | `d` | days (86 400 s) |
/// | `y` | years of 365 days |
///
/// The union of what the flags and the rotation config accepted before they shared this
/// parser; callers with a narrower range (the config's 200-year cap) check it themselves.
///
/// # Errors
/// A message quoting the text: not a number, an unknown unit, or too long for a `Duration`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Some(millis) = text.strip_suffix("ms") {
        return millis
            .parse()
            .map(Duration::from_millis)
            .map_err(|_| format!("invalid duration {text:?}"));
    }
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, ""), |i| text.split_at(i));
    let value: u64 = number
        .parse()
        .map_err(|_| format!("invalid duration {text:?}"))?;
    let unit_seconds: u64 = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "y" => 365 * 86_400,
        _ => {
            return Err(format!(
                "invalid duration unit in {text:?} (use ms, s, m, h, d or y)"
            ));
        }
    };
    value
        .checked_mul(unit_seconds)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("duration {text:?} is out of range"))
}

/// RFC 3339 (UTC, seconds), as library-go writes its annotations; the number itself when the
/// time is out of the calendar's range.
pub(crate) fn rfc3339(unix: i64) -> String {
    ::time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&::time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| unix.to_string())
}

/// The wall clock, in seconds since the Unix epoch (0 before it).
pub(crate) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// `--now`: RFC 3339 or Unix seconds.
///
/// # Errors
/// A [`ConfigError`] naming the flag and quoting the text.
pub(crate) fn parse_now(text: &str) -> Result<i64, ConfigError> {
    if let Ok(seconds) = text.parse::<i64>() {
        return Ok(seconds);
    }
    ::time::OffsetDateTime::parse(text, &::time::format_description::well_known::Rfc3339)
        .map(|t| t.unix_timestamp())
        .map_err(|err| ConfigError(format!("--now {text:?}: {err}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_accept_seconds_minutes_and_hours() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_duration("5w").is_err());
        assert!(parse_duration("m").is_err());
    }

    #[test]
    fn durations_cover_days_and_years() {
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(
            parse_duration("10y"),
            Ok(Duration::from_secs(3650 * 86_400))
        );
        assert_eq!(parse_duration(" 90s "), Ok(Duration::from_secs(90)));
        assert!(parse_duration("99999999999999y").is_err());
        assert!(parse_duration("5w").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn times_format_as_rfc3339_and_now_parses_both_forms() {
        assert_eq!(rfc3339(784_111_777), "1994-11-06T08:49:37Z");
        assert_eq!(rfc3339(i64::MAX), i64::MAX.to_string());
        assert_eq!(parse_now("784111777").unwrap(), 784_111_777);
        assert_eq!(parse_now("1994-11-06T08:49:37Z").unwrap(), 784_111_777);
        assert!(parse_now("yesterday").unwrap_err().0.contains("--now"));
        assert!(unix_now() > 1_700_000_000);
    }
}
