//! Statistics used wherever tooltune reports a rate or compares two candidates: Wilson score intervals, the
//! exact McNemar test for paired binary outcomes, and a paired sign-flip permutation test for per-task scores.
//!
//! Wilson rather than the normal ("Wald") interval because rates here are often near 0 or 1 over a few dozen
//! tasks, where Wald intervals collapse to zero width or leave [0, 1].

use serde::Serialize;
use statrs::distribution::{
    Binomial, ContinuousCDF, Discrete, DiscreteCDF, Hypergeometric, Normal,
};

/// A rate with its 95% Wilson score interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
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

    /// No trials: what a figure recorded before it existed reads as.
    pub fn empty() -> Rate {
        Rate::wilson(0, 0)
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
    // At 0 or all hits the interval's end is exactly 0 or 1; computed, it rounds to 1e-17 or 0.9999999999999999,
    // which reads as a bug in a server author's JSON.
    Rate {
        hits,
        trials,
        value: Some(p),
        low: if hits == 0 {
            0.0
        } else {
            (centre - half).max(0.0)
        },
        high: if hits == trials {
            1.0
        } else {
            (centre + half).min(1.0)
        },
    }
}

fn z_for(confidence: f64) -> f64 {
    // The standard normal always constructs; the fallback is the textbook 95% value.
    Normal::new(0.0, 1.0)
        .map(|n| n.inverse_cdf(1.0 - (1.0 - confidence) / 2.0))
        .unwrap_or(1.959_963_984_540_054)
}

/// Result of a paired comparison of two candidates on the same tasks.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
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

/// Two-sided p-value of Fisher's exact test that two independent groups have the same rate: `hits_a` of
/// `trials_a` against `hits_b` of `trials_b` (A/B variants over separate sessions, which are not paired). Exact
/// rather than the normal approximation because a variant often has a few dozen sessions and rates near 0 or 1.
/// The tables as likely as the observed one or less are summed (the usual two-sided definition); 1.0 when
/// either group is empty or nothing varies.
pub fn fisher_exact(hits_a: u64, trials_a: u64, hits_b: u64, trials_b: u64) -> f64 {
    let (ha, hb) = (hits_a.min(trials_a), hits_b.min(trials_b));
    let n = trials_a + trials_b;
    let k = ha + hb;
    if trials_a == 0 || trials_b == 0 || k == 0 || k == n {
        return 1.0;
    }
    let Ok(h) = Hypergeometric::new(n, k, trials_a) else {
        return 1.0;
    };
    let observed = h.pmf(ha);
    let lo = trials_a.saturating_sub(n - k);
    let hi = trials_a.min(k);
    // A relative tolerance, so tables exactly as likely as the observed one are not lost to rounding.
    let p: f64 = (lo..=hi)
        .map(|x| h.pmf(x))
        .filter(|p| *p <= observed * (1.0 + 1e-7))
        .sum();
    p.min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fisher_matches_published_values() {
        // Fisher's tea-tasting table [[3, 1], [1, 3]]: two-sided p = 0.4857.
        assert!(close(fisher_exact(3, 4, 1, 4), 0.4857));
        // [[10, 0], [0, 10]]: p = 2 / C(20, 10) = 1.0825e-5.
        assert!((fisher_exact(10, 10, 0, 10) - 1.0825e-5).abs() < 1e-8);
        assert_eq!(fisher_exact(5, 10, 5, 10), 1.0);
        assert_eq!(fisher_exact(0, 0, 3, 4), 1.0);
        assert_eq!(fisher_exact(0, 5, 0, 7), 1.0);
    }

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
    fn wilson_ends_at_exactly_zero_and_one() {
        for n in 1..=200 {
            assert_eq!(Rate::wilson(n, n).high, 1.0, "{n}/{n}");
            assert_eq!(Rate::wilson(0, n).low, 0.0, "0/{n}");
            assert!(Rate::wilson(n - 1, n).high < 1.0, "{}/{n}", n - 1);
        }
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

/// Above this many non-zero differences the permutation test samples sign flips instead of enumerating them
/// (2^20 = 1,048,576 flips still take well under a second).
pub const EXACT_PERMUTATION_LIMIT: usize = 20;

/// How the Monte Carlo permutation test samples, when there are more than [`EXACT_PERMUTATION_LIMIT`] non-zero
/// differences. The seed makes the p-value reproducible; it is ignored when the test is exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct MonteCarlo {
    /// Random sign flips drawn.
    pub permutations: u32,
    /// Seed of the ChaCha8 generator that draws them.
    pub seed: u64,
}

impl Default for MonteCarlo {
    /// 100,000 flips: the Monte Carlo standard error of a p-value near 0.05 is then about 0.0007.
    fn default() -> Self {
        MonteCarlo {
            permutations: 100_000,
            seed: 0,
        }
    }
}

/// How a permutation p-value was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum PermutationMethod {
    /// Every one of the 2^n sign flips was enumerated.
    Exact,
    /// Sign flips were sampled; the p-value is (1 + hits) / (1 + permutations), which never reports 0.
    MonteCarlo(MonteCarlo),
}

/// Result of a paired permutation test of two candidates scored on the same tasks.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct PairedPermutation {
    /// Pairs (tasks) compared.
    pub pairs: u64,
    /// Pairs whose scores differ; only these carry information.
    pub nonzero: u64,
    /// Mean of (second - first) over all pairs: positive when the second candidate scored higher.
    pub mean_difference: f64,
    /// Two-sided p-value (1.0 when no pair differs).
    pub p_value: f64,
    /// Exact enumeration or Monte Carlo.
    pub method: PermutationMethod,
}

/// Paired sign-flip permutation test on per-task scores `(first, second)`.
///
/// Under the null hypothesis that the two candidates are exchangeable on each task, every difference
/// `second - first` is as likely to have either sign. The statistic is |sum of differences|; the two-sided p-value
/// is the share of sign assignments whose |sum| is at least the observed one. Zero differences are left out: they
/// add nothing to any sum and would only double both counts. With at most [`EXACT_PERMUTATION_LIMIT`] non-zero
/// differences every assignment is enumerated; beyond that `monte_carlo` says how many to draw and from which seed.
pub fn paired_permutation(
    pairs: impl IntoIterator<Item = (f64, f64)>,
    monte_carlo: MonteCarlo,
) -> Result<PairedPermutation, crate::ObjectivesError> {
    let mut n_pairs = 0u64;
    let mut total = 0.0;
    let mut diffs = Vec::new();
    for (index, (a, b)) in pairs.into_iter().enumerate() {
        if !a.is_finite() || !b.is_finite() {
            return Err(crate::ObjectivesError::NonFiniteScore { index, a, b });
        }
        n_pairs += 1;
        let d = b - a;
        total += d;
        if d != 0.0 {
            diffs.push(d);
        }
    }
    let mean_difference = if n_pairs == 0 {
        0.0
    } else {
        total / n_pairs as f64
    };
    let nonzero = diffs.len() as u64;
    if diffs.is_empty() {
        return Ok(PairedPermutation {
            pairs: n_pairs,
            nonzero,
            mean_difference,
            p_value: 1.0,
            method: PermutationMethod::Exact,
        });
    }
    let (p_value, method) = if diffs.len() <= EXACT_PERMUTATION_LIMIT {
        (exact_sign_flip(&diffs), PermutationMethod::Exact)
    } else {
        if monte_carlo.permutations == 0 {
            return Err(crate::ObjectivesError::NoPermutations);
        }
        (
            monte_carlo_sign_flip(&diffs, monte_carlo),
            PermutationMethod::MonteCarlo(monte_carlo),
        )
    };
    Ok(PairedPermutation {
        pairs: n_pairs,
        nonzero,
        mean_difference,
        p_value,
        method,
    })
}

/// The observed |sum| less a rounding allowance: sums of the same numbers in another order can differ in the last
/// bits, and the observed assignment itself must always count as "at least as extreme".
fn threshold(diffs: &[f64]) -> f64 {
    let observed = diffs.iter().sum::<f64>().abs();
    let scale: f64 = diffs.iter().map(|d| d.abs()).sum();
    observed - 1e-9 * scale
}

/// Exact two-sided p-value over all 2^n sign assignments, walked in Gray-code order so that each step flips one
/// sign and updates the sum in constant time.
fn exact_sign_flip(diffs: &[f64]) -> f64 {
    let n = diffs.len();
    let limit = threshold(diffs);
    let mut signs = vec![1.0f64; n];
    let mut sum: f64 = diffs.iter().sum();
    let mut hits: u64 = u64::from(sum.abs() >= limit);
    let total: u64 = 1u64 << n;
    for i in 1..total {
        // The bit that changes between Gray codes i-1 and i is the lowest set bit of i.
        let k = i.trailing_zeros() as usize;
        signs[k] = -signs[k];
        sum += 2.0 * signs[k] * diffs[k];
        if sum.abs() >= limit {
            hits += 1;
        }
    }
    hits as f64 / total as f64
}

/// Monte Carlo two-sided p-value from random sign assignments, (1 + hits) / (1 + draws) (Phipson and Smyth 2010):
/// counting the observed assignment keeps the estimate valid and never zero.
fn monte_carlo_sign_flip(diffs: &[f64], mc: MonteCarlo) -> f64 {
    use rand::{Rng, SeedableRng};
    let limit = threshold(diffs);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(mc.seed);
    let mut hits = 0u64;
    for _ in 0..mc.permutations {
        let mut sum = 0.0;
        for chunk in diffs.chunks(64) {
            let bits: u64 = rng.random();
            for (j, d) in chunk.iter().enumerate() {
                if bits >> j & 1 == 1 {
                    sum += d
                } else {
                    sum -= d
                }
            }
        }
        if sum.abs() >= limit {
            hits += 1;
        }
    }
    (1 + hits) as f64 / (1 + u64::from(mc.permutations)) as f64
}

#[cfg(test)]
mod permutation_tests {
    use super::*;

    fn test(pairs: &[(f64, f64)]) -> PairedPermutation {
        paired_permutation(pairs.iter().copied(), MonteCarlo::default()).expect("finite scores")
    }

    fn from_diffs(d: &[f64]) -> Vec<(f64, f64)> {
        d.iter().map(|&d| (0.0, d)).collect()
    }

    #[test]
    fn hand_computed_small_cases() {
        // {1, 2, 3}: the 8 signed sums are 6, 4, 2, 0, 0, -2, -4, -6; |sum| >= 6 twice: p = 2/8.
        let r = test(&from_diffs(&[1.0, 2.0, 3.0]));
        assert_eq!(
            (r.p_value, r.nonzero, r.method),
            (0.25, 3, PermutationMethod::Exact)
        );
        assert_eq!(r.mean_difference, 2.0);
        // {3, -1, 2}: observed |4|; sums of +-3 +-1 +-2 with |sum| >= 4 are 6, 4, -4, -6: p = 4/8.
        let r = test(&from_diffs(&[3.0, -1.0, 2.0]));
        assert_eq!(r.p_value, 0.5);
        // Five equal wins: only all-plus and all-minus reach 5: p = 2/32.
        let r = test(&from_diffs(&[1.0; 5]));
        assert_eq!(r.p_value, 0.0625);
        // Binary outcomes, the second candidate better on 6 of 6 discordant tasks: same as exact McNemar, 2/64.
        let pairs: Vec<(f64, f64)> = std::iter::repeat_n((0.0, 1.0), 6)
            .chain(std::iter::repeat_n((1.0, 1.0), 4))
            .collect();
        let r = test(&pairs);
        assert_eq!((r.pairs, r.nonzero, r.p_value), (10, 6, 0.03125));
        assert!((r.mean_difference - 0.6).abs() < 1e-12);
    }

    #[test]
    fn zero_differences_are_left_out_and_ties_give_one() {
        let r = test(&[(0.5, 0.5), (1.0, 1.0)]);
        assert_eq!((r.nonzero, r.p_value, r.mean_difference), (0, 1.0, 0.0));
        let r = test(&[]);
        assert_eq!((r.pairs, r.p_value), (0, 1.0));
        // Adding tied pairs does not change the p-value.
        let a = test(&from_diffs(&[1.0, 2.0, 3.0]));
        let b = test(&[(0.0, 1.0), (0.3, 0.3), (0.0, 2.0), (0.0, 3.0), (0.9, 0.9)]);
        assert_eq!(a.p_value, b.p_value);
    }

    #[test]
    fn fractional_scores_count_the_observed_assignment_despite_rounding() {
        // Differences of scores like 2/3 - 1/3 do not add up exactly; the observed flip must still count.
        let pairs = [(1.0 / 3.0, 2.0 / 3.0), (0.1, 0.4), (0.2, 0.9)];
        let r = test(&pairs);
        assert_eq!(r.p_value, 0.25);
    }

    #[test]
    fn darwin_zea_mays_matches_fisher() {
        // Fisher (1935), The Design of Experiments, section 21: Darwin's 15 paired differences (eighths of an inch);
        // 863 of the 32,768 sign assignments reach the observed sum 314 or more, so the two-sided p is 1726/32768.
        let d = [
            49.0, -67.0, 8.0, 16.0, 6.0, 23.0, 28.0, 41.0, 14.0, 29.0, 56.0, 24.0, 75.0, 60.0,
            -48.0,
        ];
        let r = test(&from_diffs(&d));
        assert_eq!(r.method, PermutationMethod::Exact);
        assert_eq!(r.p_value, 1726.0 / 32768.0);
        // The Monte Carlo path agrees within its sampling error (seeded, so the check is reproducible).
        let p = monte_carlo_sign_flip(
            &d,
            MonteCarlo {
                permutations: 50_000,
                seed: 7,
            },
        );
        assert!((p - 1726.0 / 32768.0).abs() < 0.005, "{p}");
    }

    #[test]
    fn more_than_twenty_differences_use_the_seeded_monte_carlo() {
        let mc = MonteCarlo {
            permutations: 2_000,
            seed: 11,
        };
        // 30 wins out of 30: the exact p is 2/2^30, so no sampled flip reaches it and p = 1/(1 + 2000).
        let r = paired_permutation(from_diffs(&[1.0; 30]), mc).expect("finite");
        assert_eq!(r.method, PermutationMethod::MonteCarlo(mc));
        assert_eq!(r.p_value, 1.0 / 2001.0);
        // 15 wins and 15 losses of equal size: every flip is at least as extreme as the observed sum 0.
        let mut d = vec![1.0; 15];
        d.extend([-1.0; 15]);
        let r = paired_permutation(from_diffs(&d), mc).expect("finite");
        assert_eq!(r.p_value, 1.0);
        // The same seed gives the same p-value; the limit itself is still exact.
        let d: Vec<f64> = (0..25)
            .map(|i| if i % 3 == 0 { -0.5 } else { 0.4 })
            .collect();
        let a = paired_permutation(from_diffs(&d), mc).expect("finite");
        let b = paired_permutation(from_diffs(&d), mc).expect("finite");
        assert_eq!(a, b);
        let r =
            paired_permutation(from_diffs(&[1.0; EXACT_PERMUTATION_LIMIT]), mc).expect("finite");
        assert_eq!(r.method, PermutationMethod::Exact);
    }

    #[test]
    fn bad_input_is_named() {
        let err = paired_permutation([(0.0, 1.0), (f64::NAN, 0.0)], MonteCarlo::default())
            .expect_err("NaN");
        // NaN is unequal to itself, so match rather than compare.
        assert!(
            matches!(err, crate::ObjectivesError::NonFiniteScore { index: 1, a, b } if a.is_nan() && b == 0.0),
            "{err:?}"
        );
        let zero = MonteCarlo {
            permutations: 0,
            seed: 1,
        };
        let err = paired_permutation(from_diffs(&[1.0; 21]), zero).expect_err("no permutations");
        assert_eq!(err, crate::ObjectivesError::NoPermutations);
    }
}
