//! Statistics used wherever tooltune reports a rate or compares two candidates: Wilson score intervals and the
//! exact McNemar test for paired binary outcomes.
//!
//! Wilson rather than the normal ("Wald") interval because rates here are often near 0 or 1 over a few dozen
//! tasks, where Wald intervals collapse to zero width or leave [0, 1].

use serde::Serialize;
use statrs::distribution::{Binomial, ContinuousCDF, DiscreteCDF, Normal};

/// A rate with its 95% Wilson score interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Rate {
    /// Successes (numerator).
    pub hits: u64,
    /// Trials (denominator).
    pub trials: u64,
    /// hits / trials, or `None` when there were no trials.
    pub value: Option<f64>,
    /// Lower bound of the 95% interval (0 when there were no trials).
    pub low: f64,
    /// Upper bound of the 95% interval (1 when there were no trials).
    pub high: f64,
}

impl Rate {
    /// The rate `hits / trials` with a 95% Wilson interval. `hits` larger than `trials` is clamped, because a
    /// rate above one can only come from a counting bug upstream and an interval must still be printable.
    pub fn wilson(hits: u64, trials: u64) -> Rate {
        wilson_at(hits, trials, 0.95)
    }
}

/// Wilson score interval at the given two-sided confidence level.
pub fn wilson_at(hits: u64, trials: u64, confidence: f64) -> Rate {
    let hits = hits.min(trials);
    if trials == 0 {
        return Rate {
            hits,
            trials,
            value: None,
            low: 0.0,
            high: 1.0,
        };
    }
    let z = z_for(confidence);
    let n = trials as f64;
    let p = hits as f64 / n;
    let z2 = z * z;
    let denom = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denom;
    let half = z * ((p * (1.0 - p) / n) + z2 / (4.0 * n * n)).sqrt() / denom;
    Rate {
        hits,
        trials,
        value: Some(p),
        low: (centre - half).max(0.0),
        high: (centre + half).min(1.0),
    }
}

fn z_for(confidence: f64) -> f64 {
    // The standard normal always constructs; the fallback is the textbook 95% value.
    Normal::new(0.0, 1.0)
        .map(|n| n.inverse_cdf(1.0 - (1.0 - confidence) / 2.0))
        .unwrap_or(1.959_963_984_540_054)
}

/// Result of a paired comparison of two candidates on the same tasks.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Paired {
    /// Tasks where only the first candidate succeeded.
    pub only_a: u64,
    /// Tasks where only the second candidate succeeded.
    pub only_b: u64,
    /// Two-sided p-value of the exact McNemar test (1.0 when no task is discordant).
    pub p_value: f64,
}

/// Exact (binomial) McNemar test on paired binary outcomes: under the null hypothesis the discordant pairs split
/// 50/50, so the p-value is the two-sided binomial tail of the smaller count.
pub fn mcnemar_exact(pairs: impl IntoIterator<Item = (bool, bool)>) -> Paired {
    let (mut only_a, mut only_b) = (0u64, 0u64);
    for (a, b) in pairs {
        match (a, b) {
            (true, false) => only_a += 1,
            (false, true) => only_b += 1,
            _ => {}
        }
    }
    let n = only_a + only_b;
    let p_value = if n == 0 {
        1.0
    } else {
        let k = only_a.min(only_b);
        Binomial::new(0.5, n)
            .map(|b| (2.0 * b.cdf(k)).min(1.0))
            .unwrap_or(1.0)
    };
    Paired {
        only_a,
        only_b,
        p_value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 5e-4
    }

    #[test]
    fn wilson_matches_published_values() {
        // Newcombe (1998), Statistics in Medicine 17, table I: 81/263 -> 0.2553 to 0.3662; 15/148 -> 0.0624 to 0.1605.
        let r = Rate::wilson(81, 263);
        assert!(close(r.low, 0.2553) && close(r.high, 0.3662), "{r:?}");
        let r = Rate::wilson(15, 148);
        assert!(close(r.low, 0.0624) && close(r.high, 0.1605), "{r:?}");
        // 0/10 -> 0 to 0.2775 (same table: 0/20 -> 0 to 0.1611).
        let r = Rate::wilson(0, 20);
        assert!(close(r.low, 0.0) && close(r.high, 0.1611), "{r:?}");
    }

    #[test]
    fn wilson_without_trials_is_the_whole_unit_interval() {
        let r = Rate::wilson(0, 0);
        assert_eq!((r.value, r.low, r.high), (None, 0.0, 1.0));
    }

    #[test]
    fn mcnemar_exact_known_values() {
        // 0 vs 6 discordant: p = 2 * 0.5^6 = 0.03125.
        let p = mcnemar_exact(std::iter::repeat_n((false, true), 6));
        assert!(close(p.p_value, 0.03125), "{p:?}");
        // 2 vs 8: p = 2 * P(X <= 2 | n=10) = 2 * 56/1024 = 0.109375.
        let pairs = std::iter::repeat_n((true, false), 2)
            .chain(std::iter::repeat_n((false, true), 8))
            .chain(std::iter::repeat_n((true, true), 5));
        let p = mcnemar_exact(pairs);
        assert_eq!((p.only_a, p.only_b), (2, 8));
        assert!(close(p.p_value, 0.109375), "{p:?}");
        // Balanced discordance caps at 1.
        let p = mcnemar_exact([(true, false), (false, true)]);
        assert!(close(p.p_value, 1.0));
    }
}
