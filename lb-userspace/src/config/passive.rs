//! `passive_health:` of a VIP: the settings of passive health and their
//! rules. The policy that uses them is `crate::passive`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `passive_health:` of a VIP.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PassiveHealth {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default = "default_window", with = "crate::config::duration")]
    pub window: Duration,
    #[serde(default = "default_min_syns")]
    pub min_syns: u64,
    #[serde(default = "default_ratio")]
    pub ratio: f64,
    #[serde(default = "default_relative")]
    pub relative: f64,
    #[serde(default = "default_ejection", with = "crate::config::duration")]
    pub ejection: Duration,
    #[serde(default = "default_max_ejection", with = "crate::config::duration")]
    pub max_ejection: Duration,
    #[serde(default = "default_max_percent")]
    pub max_ejection_percent: u32,
}

// `f64` fields: equality is exact, as for any setting read from a file.
impl Eq for PassiveHealth {}

fn yes() -> bool {
    true
}
fn default_window() -> Duration {
    Duration::from_secs(30)
}
fn default_min_syns() -> u64 {
    20
}
fn default_ratio() -> f64 {
    0.3
}
fn default_relative() -> f64 {
    3.0
}
fn default_ejection() -> Duration {
    Duration::from_secs(30)
}
fn default_max_ejection() -> Duration {
    Duration::from_secs(600)
}
fn default_max_percent() -> u32 {
    50
}

impl Default for PassiveHealth {
    fn default() -> Self {
        Self {
            enabled: true,
            window: default_window(),
            min_syns: default_min_syns(),
            ratio: default_ratio(),
            relative: default_relative(),
            ejection: default_ejection(),
            max_ejection: default_max_ejection(),
            max_ejection_percent: default_max_percent(),
        }
    }
}

impl PassiveHealth {
    /// Problems of the settings, as `(field, message)`.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if self.window < Duration::from_secs(5) || self.window > Duration::from_secs(3600) {
            out.push(("window", "must be between 5s and 1h".to_string()));
        }
        // A fraction: 30 meant as 30% would never be reached (a backend's
        // retried SYNs are at most all of them), turning ejection off.
        if !(0.0..=1.0).contains(&self.ratio) || self.ratio.is_nan() {
            out.push((
                "ratio",
                format!(
                    "{} is out of range 0-1 (a fraction of the SYNs: 0.3 for 30%)",
                    self.ratio
                ),
            ));
        }
        if !(1.0..=1000.0).contains(&self.relative) {
            out.push((
                "relative",
                format!("{} is out of range 1-1000", self.relative),
            ));
        }
        if self.min_syns == 0 {
            out.push(("min_syns", "must be at least 1".to_string()));
        }
        if self.ejection < Duration::from_secs(1) || self.max_ejection < self.ejection {
            out.push((
                "ejection",
                "must be at least 1s and at most max_ejection".to_string(),
            ));
        }
        if self.max_ejection_percent > 100 {
            out.push((
                "max_ejection_percent",
                format!("{}% is out of range 0-100", self.max_ejection_percent),
            ));
        }
        out
    }

    /// How many of `n` backends may be ejected at once: at least one of
    /// two or more, unless `max_ejection_percent` is 0, which ejects none
    /// (the counts and `lbctl health` still show who would be).
    pub fn cap(&self, n: usize) -> usize {
        if n < 2 || self.max_ejection_percent == 0 {
            return 0;
        }
        (n * self.max_ejection_percent as usize / 100).max(1)
    }
}
