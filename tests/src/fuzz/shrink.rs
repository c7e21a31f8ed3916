//! Shrinks a violating frame: cuts its tail and zeroes its bytes, keeping
//! each change only while the same violation persists, so the report shows
//! the smallest reproducer found within a bounded number of runs.

use anyhow::Result;

/// Most candidate frames tried.
const MAX_TRIES: usize = 4000;

/// The smallest frame derived from `frame` for which `fails` holds.
pub fn shrink(frame: &[u8], mut fails: impl FnMut(&[u8]) -> Result<bool>) -> Result<Vec<u8>> {
    let mut best = frame.to_vec();
    let mut tries = 0;
    if !fails(&best)? {
        // Not reproducible from the frame alone (it depended on state).
        return Ok(best);
    }
    // Cut the tail, in halving steps.
    let mut step = best.len() / 2;
    while step > 0 && tries < MAX_TRIES {
        while best.len() > step && tries < MAX_TRIES {
            tries += 1;
            let cut = &best[..best.len() - step];
            if !fails(cut)? {
                break;
            }
            best.truncate(best.len() - step);
        }
        step /= 2;
    }
    // Zero whole chunks, then single bytes.
    for chunk in [64, 16, 4, 1] {
        let mut at = 0;
        while at < best.len() && tries < MAX_TRIES {
            let end = (at + chunk).min(best.len());
            if best[at..end].iter().any(|b| *b != 0) {
                tries += 1;
                let mut candidate = best.clone();
                candidate[at..end].fill(0);
                if fails(&candidate)? {
                    best = candidate;
                }
            }
            at = end;
        }
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_only_what_the_failure_needs() {
        let frame: Vec<u8> = (1..=100).collect();
        // "Fails" while byte 10 is 11 and the frame is at least 20 bytes.
        let small = shrink(&frame, |f| Ok(f.len() >= 20 && f[10] == 11)).expect("shrink");
        assert_eq!(small.len(), 20);
        assert_eq!(small[10], 11);
        assert!(small.iter().enumerate().all(|(i, b)| i == 10 || *b == 0));
    }
}
