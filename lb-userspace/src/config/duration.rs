//! Durations in YAML: a number with a unit (`500ms`, `2s`, `5m`, `1h`),
//! written back the same way. A number without a unit is refused: some
//! tools read it as seconds (keepalived), others as milliseconds
//! (HAProxy's timeouts), and a drain of 65,536 seconds meant as
//! milliseconds drains for eighteen hours. A leaf: nothing of the crate
//! but [`super::error::excerpt`].

use std::time::Duration;

use serde::{Deserializer, Serializer, de};

pub fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| {
        format!(
            "{} is not a duration (e.g. 500ms, 2s, 5m)",
            super::error::excerpt(s)
        )
    })?;
    let secs = match unit.trim() {
        "" => {
            return Err(format!(
                "{} has no unit: write {num}s (seconds) or {num}ms (milliseconds)",
                super::error::excerpt(s)
            ));
        }
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        u => {
            return Err(format!(
                "unknown unit {} in {} (use ms, s, m or h)",
                super::error::excerpt(u),
                super::error::excerpt(s)
            ));
        }
    };
    if !(0.0..=86_400.0 * 365.0).contains(&secs) {
        return Err(format!("{} is out of range", super::error::excerpt(s)));
    }
    // Whole milliseconds: a finer one was written back (state file, API)
    // as a whole number of them, 0.5ms as 0s, which then failed its rule.
    let ms = secs * 1000.0;
    if (ms - ms.round()).abs() > 1e-6 {
        return Err(format!(
            "{} is finer than a millisecond (durations are whole milliseconds)",
            super::error::excerpt(s)
        ));
    }
    Ok(Duration::from_millis(ms.round() as u64))
}

pub fn format(d: &Duration) -> String {
    if d.subsec_millis() != 0 || d.is_zero() {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}s", d.as_secs())
    }
}

pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format(d))
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    struct V;
    impl de::Visitor<'_> for V {
        type Value = Duration;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a duration with a unit, such as 500ms, 2s, 5m")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
            parse(&v.to_string()).map_err(E::custom)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
            parse(&v.to_string()).map_err(E::custom)
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Duration, E> {
            parse(&v.to_string()).map_err(E::custom)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
            parse(v).map_err(E::custom)
        }
    }
    d.deserialize_any(V)
}

/// [`deserialize`] for a setting that may be left out (`#[serde(default,
/// deserialize_with = "duration::some")]`): its default is stated
/// elsewhere.
pub fn some<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    deserialize(d).map(Some)
}
