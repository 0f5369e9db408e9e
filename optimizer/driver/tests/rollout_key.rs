//! Property tests of the content address of a rollout or screen: the same parts give the same key, and any
//! difference in any part gives another (a collision would hand one candidate's result to another).

use proptest::prelude::*;
use tooltune_driver::rollout_key;

type Parts = (String, String, String, u32, Option<u64>);

fn parts() -> impl Strategy<Value = Parts> {
    // Short strings over a small alphabet that includes the separators a naive encoding would confuse.
    let s = || proptest::string::string_regex("[ab\\x00/:-]{0,6}").expect("regex");
    (s(), s(), s(), 0u32..4, proptest::option::of(0u64..4))
}

fn key(p: &Parts) -> String {
    rollout_key(&p.0, &p.1, &p.2, p.3, p.4)
}

proptest! {
    #[test]
    fn equal_parts_give_equal_keys_and_different_parts_different_keys(a in parts(), b in parts()) {
        prop_assert_eq!(key(&a), key(&a.clone()));
        if a == b {
            prop_assert_eq!(key(&a), key(&b));
        } else {
            prop_assert_ne!(key(&a), key(&b), "{:?} and {:?} collide", a, b);
        }
    }

    #[test]
    fn a_key_names_its_kind(p in parts()) {
        let k = key(&p);
        let prefix = format!("{}-", p.0);
        prop_assert!(k.starts_with(&prefix));
    }
}

#[test]
fn parts_that_contain_a_separator_do_not_run_into_each_other() {
    assert_ne!(
        rollout_key("screen", "w\0t", "x", 0, None),
        rollout_key("screen", "w", "t\0x", 0, None)
    );
}
