//! Go's `time.ParseDuration`, for the etcd flags written as Go durations
//! (`--auto-compaction-retention`, the `ttl` of `--auth-token`).

use std::time::Duration;

/// A Go `time.ParseDuration` string: a sequence of numbers (decimals
/// allowed) each with a unit of ns, us, µs, ms, s, m or h, e.g. `1h30m`,
/// `1.5h`, `2s`, with Go's error texts. Negative durations are refused:
/// every duration etcd's flags take (a compaction retention, a token's
/// ttl) is a length of time, and a negative one has no meaning.
pub fn parse(text: &str) -> Result<Duration, String> {
    let invalid = || format!("time: invalid duration {text:?}");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest.starts_with('-') || rest.is_empty() {
        return Err(invalid());
    }
    let mut nanos = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("time: missing unit in duration {text:?}"))?;
        let number: f64 = rest[..number_len].parse().map_err(|_| invalid())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            unit => return Err(format!("time: unknown unit {unit:?} in duration {text:?}")),
        };
        nanos += number * scale;
        rest = &rest[unit_len..];
    }
    Ok(Duration::from_nanos(nanos as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("+2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(
            parse("10"),
            Err("time: missing unit in duration \"10\"".to_string())
        );
        assert_eq!(
            parse("5x"),
            Err("time: unknown unit \"x\" in duration \"5x\"".to_string())
        );
        assert!(parse("").is_err());
        assert!(parse("-1s").is_err());
    }
}
