//! Durations on the command line: a bare number of seconds (`5`, `0.5`), or a number with a
//! unit (`2s`, `500ms`, `1.5s`, `1m`).

use std::time::Duration;

/// What `--help` says of a duration: the parser and the help texts say the same.
pub(super) const FORMS: &str = "seconds (5, 0.5) or with a unit (500ms, 2s, 1m)";

pub(super) fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration: give {FORMS}"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        // A bare number is seconds, as sleep(1) and timeout(1) take it.
        "s" | "" => value,
        "m" => value * 60.0,
        _ => return Err(format!("unknown unit {unit:?} in {text:?}: use ms, s or m")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_with_units() {
        assert_eq!(parse("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse("0ms"), Ok(Duration::ZERO));
    }

    #[test]
    fn a_bare_number_is_seconds() {
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse(" 2 "), Ok(Duration::from_secs(2)));
    }

    #[test]
    fn what_is_no_duration_says_so() {
        for bad in ["", "x", "2h", "-1s", "1e999s", "1e999", ".", "1..2"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse("2h"),
            Err(r#"unknown unit "h" in "2h": use ms, s or m"#.to_owned())
        );
    }
}
