//! Wall-clock times as the JSON outputs give them: RFC 3339, UTC, to the millisecond
//! (`2026-12-02T05:21:03.123Z`), fixed width so that lines sort as text.

use std::{num::NonZeroU8, time::SystemTime};

use time::{
    OffsetDateTime,
    format_description::well_known::{
        Iso8601,
        iso8601::{Config, EncodedConfig, TimePrecision},
    },
};

/// ISO 8601's extended form with three decimals and `Z`: a profile of RFC 3339.
const RFC3339_MILLIS: EncodedConfig = Config::DEFAULT
    .set_time_precision(TimePrecision::Second {
        decimal_digits: NonZeroU8::new(3),
    })
    .encode();

/// `at` in RFC 3339, UTC, to the millisecond.
pub(super) fn rfc3339_millis(at: SystemTime) -> String {
    OffsetDateTime::from(at)
        .format(&Iso8601::<RFC3339_MILLIS>)
        // Only a year past 9999 cannot be written so.
        .unwrap_or_else(|_| "9999-12-31T23:59:59.999Z".to_owned())
}

/// Now, in RFC 3339, UTC, to the millisecond.
pub(super) fn now() -> String {
    rfc3339_millis(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn times_are_rfc3339_utc_to_the_millisecond() {
        let at = UNIX_EPOCH + Duration::from_millis(1_796_188_863_123);
        assert_eq!(rfc3339_millis(at), "2026-12-02T05:21:03.123Z");
        assert_eq!(rfc3339_millis(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        // Truncated, not rounded: a time never reads as later than it was.
        let at = UNIX_EPOCH + Duration::from_nanos(1_999_999_999);
        assert_eq!(rfc3339_millis(at), "1970-01-01T00:00:01.999Z");
    }
}
