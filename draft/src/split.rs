//! Splits of drafted tasks, stratified by owner with a fixed seed: within each owner (no owner is a stratum of its
//! own) the tasks are shuffled by a generator seeded from the seed and the owner's name, and each goes to the split
//! furthest below its share (half train, a quarter validation, a quarter test) counting the tasks the suite
//! already holds, so `--more` keeps every owner's proportions. Pure.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use tooltune_evaluator::Split;

/// The share of each split, in the order ties are broken: a held-out task first, since a suite without test tasks
/// for an owner cannot report on it.
const SHARES: [(Split, f64); 3] = [
    (Split::Test, 0.25),
    (Split::Validation, 0.25),
    (Split::Train, 0.5),
];

/// Counts of tasks per split.
pub type Counts = BTreeMap<Split, usize>;

/// The split of each new task, whose owners are `owners` (in the tasks' order), given what the suite already holds
/// per owner. The same owners, counts and seed give the same splits.
pub fn assign(
    owners: &[Option<String>],
    existing: &BTreeMap<Option<String>, Counts>,
    seed: u64,
) -> Vec<Split> {
    let mut by_owner: BTreeMap<&Option<String>, Vec<usize>> = BTreeMap::new();
    for (i, o) in owners.iter().enumerate() {
        by_owner.entry(o).or_default().push(i);
    }
    let mut out = vec![Split::Train; owners.len()];
    for (owner, mut idx) in by_owner {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(stratum_seed(seed, owner.as_deref()));
        idx.shuffle(&mut rng);
        let mut counts = existing.get(owner).cloned().unwrap_or_default();
        for i in idx {
            let total = counts.values().sum::<usize>() + 1;
            let mut best = SHARES[0].0;
            let mut best_deficit = f64::NEG_INFINITY;
            for (split, share) in SHARES {
                let deficit = share * total as f64 - *counts.get(&split).unwrap_or(&0) as f64;
                if deficit > best_deficit + 1e-9 {
                    best = split;
                    best_deficit = deficit;
                }
            }
            *counts.entry(best).or_default() += 1;
            out[i] = best;
        }
    }
    out
}

fn stratum_seed(seed: u64, owner: Option<&str>) -> u64 {
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(owner.unwrap_or("\0no owner").as_bytes());
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(splits: &[Split], owners: &[Option<String>], owner: Option<&str>) -> [usize; 3] {
        let mut c = [0; 3];
        for (s, o) in splits.iter().zip(owners) {
            if o.as_deref() == owner {
                c[match s {
                    Split::Train => 0,
                    Split::Validation => 1,
                    Split::Test => 2,
                }] += 1;
            }
        }
        c
    }

    #[test]
    fn each_owner_gets_its_own_proportions_and_the_seed_fixes_who_goes_where() {
        let mut owners: Vec<Option<String>> = Vec::new();
        for _ in 0..4 {
            owners.push(Some("read_file".into()));
        }
        for _ in 0..3 {
            owners.push(Some("calculator".into()));
        }
        for _ in 0..2 {
            owners.push(None);
        }
        let s = assign(&owners, &BTreeMap::new(), 7);
        assert_eq!(count(&s, &owners, Some("read_file")), [2, 1, 1]);
        assert_eq!(count(&s, &owners, Some("calculator")), [1, 1, 1]);
        assert_eq!(count(&s, &owners, None), [1, 0, 1]);
        assert_eq!(
            s,
            assign(&owners, &BTreeMap::new(), 7),
            "same seed, same splits"
        );
        let differs = (0..20).any(|k| assign(&owners, &BTreeMap::new(), k) != s);
        assert!(differs, "the seed decides which task goes where");
    }

    #[test]
    fn existing_tasks_count_towards_the_shares() {
        let owners = vec![Some("t".to_string()); 2];
        let mut existing = BTreeMap::new();
        existing.insert(
            Some("t".to_string()),
            Counts::from([(Split::Train, 2), (Split::Test, 1)]),
        );
        let s = assign(&owners, &existing, 0);
        // 3 + 2 = 5 tasks: 2.5 train, 1.25 validation, 1.25 test; validation is furthest below its share first.
        assert!(s.contains(&Split::Validation), "{s:?}");
    }
}
