//! Durations on the command line: `2s`, `500ms`, `1.5s`, `1m`, or `0`.

use std::time::Duration;

pub(super) fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 2s, 500ms or 0"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "" if value == 0.0 => 0.0,
        "" => return Err(format!("{text:?} needs a unit: ms, s or m")),
        _ => return Err(format!("unknown unit {unit:?} in {text:?}: use ms, s or m")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        for bad in ["", "2", "x", "2h", "-1s", "1e999s"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
