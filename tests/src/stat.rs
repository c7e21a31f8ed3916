//! Median, min and max of a few measurements, as the benchmarks print
//! them (`lb-bench`, `lb-scale`).

/// Median, min and max of a few runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Stat {
    /// Of `v`, which must not be empty.
    pub fn of(mut v: Vec<f64>) -> Stat {
        v.sort_by(f64::total_cmp);
        Stat {
            median: v[v.len() / 2],
            min: v[0],
            max: v[v.len() - 1],
        }
    }

    /// "median (min–max)", two decimals.
    pub fn cell(&self) -> String {
        format!("{:.2} ({:.2}–{:.2})", self.median, self.min, self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_min_and_max_of_unsorted_runs() {
        let s = Stat::of(vec![3.0, 1.0, 2.0, 9.0, 0.5]);
        assert_eq!((s.median, s.min, s.max), (2.0, 0.5, 9.0));
        assert_eq!(s.cell(), "2.00 (0.50–9.00)");
    }
}
