//! `tooltune proxy`: sits between an MCP host and a server, shows the host chosen tool descriptions (from an
//! optimisation run, or one of several A/B variants), forwards every other message unchanged, and records the
//! tool calls of each session into the trace store.
//!
//! `session` is the pure part (what a message means, what to rewrite, what to record); `stdio` moves bytes
//! between the host, the proxy and the child server, `http` between a host and an upstream over Streamable HTTP;
//! `record` writes to the store off the forwarding path.

#![deny(missing_docs)]

pub mod http;
pub mod record;
pub mod session;
pub mod stdio;

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

pub use session::{RecordMode, SessionConfig};

/// Everything that can stop the proxy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The server's command could not be started.
    #[error("cannot start the server `{command}`: {source}")]
    Spawn {
        /// The program.
        command: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The descriptions name tools the server does not offer.
    #[error(
        "the server `{server}` has no tool {}; it offers: {}. Check the tool names in the overrides file",
        .missing.join(", "),
        .offered.join(", ")
    )]
    UnknownTools {
        /// The server's program.
        server: String,
        /// Tools named but not offered.
        missing: Vec<String>,
        /// What the server offers.
        offered: Vec<String>,
    },
    /// Asking the server for its tools at start-up failed.
    #[error("checking the tools of `{server}`: {message}")]
    Probe {
        /// The server's program.
        server: String,
        /// What went wrong.
        message: String,
    },
    /// Reading from the host or writing to it failed.
    #[error("host connection: {0}")]
    Io(#[from] std::io::Error),
    /// The trace store refused a write.
    #[error(transparent)]
    Store(#[from] tooltune_store::StoreError),
}

/// One A/B variant: a name and the descriptions it shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    /// The name recorded with each session.
    pub name: String,
    /// Tool name to description.
    pub rewrites: BTreeMap<String, String>,
}

/// The tools the variants name that `offered` lacks, sorted, each once: what the start-up check refuses.
pub fn missing_tools(variants: &[Variant], offered: &[String]) -> Vec<String> {
    let mut missing: Vec<String> = variants
        .iter()
        .flat_map(|v| v.rewrites.keys())
        .filter(|n| !offered.contains(n))
        .cloned()
        .collect();
    missing.sort();
    missing.dedup();
    missing
}

/// Picks a variant for a session key, in proportion to `weights` (one per variant, not all zero). The same key
/// always gets the same variant, so a host that reconnects with the same key keeps what it saw; across keys the
/// sha256 of the key spreads sessions by the weights.
pub fn assign(key: &str, weights: &[f64]) -> usize {
    let total: f64 = weights.iter().filter(|w| w.is_finite() && **w > 0.0).sum();
    if weights.is_empty() || total <= 0.0 {
        return 0;
    }
    let digest = Sha256::digest(key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    // 53 bits: exactly representable, uniform in [0, 1).
    let u = (u64::from_be_bytes(first) >> 11) as f64 / (1u64 << 53) as f64;
    let mut acc = 0.0;
    for (i, w) in weights.iter().enumerate() {
        if w.is_finite() && *w > 0.0 {
            acc += w / total;
            if u < acc {
                return i;
            }
        }
    }
    weights
        .iter()
        .rposition(|w| w.is_finite() && *w > 0.0)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn assignment_follows_the_weights() {
        let n = 20_000;
        let mut counts = [0usize; 2];
        for i in 0..n {
            counts[assign(&format!("session-{i}"), &[1.0, 3.0])] += 1;
        }
        let share = counts[1] as f64 / n as f64;
        assert!((share - 0.75).abs() < 0.02, "share of the second: {share}");
        assert_eq!(assign("k", &[0.0, 1.0]), 1);
        assert_eq!(assign("k", &[]), 0);
    }

    #[test]
    fn missing_tools_are_those_any_variant_names_that_the_server_lacks() {
        let v = |name: &str, tools: &[&str]| Variant {
            name: name.into(),
            rewrites: tools.iter().map(|t| (t.to_string(), "x".into())).collect(),
        };
        let offered = vec!["a".to_string(), "b".to_string()];
        assert_eq!(
            missing_tools(&[v("1", &["a", "z"]), v("2", &["z", "c"])], &offered),
            vec!["c".to_string(), "z".to_string()]
        );
        assert!(missing_tools(&[v("1", &["b"]), v("2", &[])], &offered).is_empty());
    }

    proptest! {
        #[test]
        fn the_same_key_gets_the_same_variant_and_never_a_zero_weight(key in ".{0,40}", w in proptest::collection::vec(0.0f64..5.0, 1..5)) {
            let a = assign(&key, &w);
            prop_assert_eq!(a, assign(&key, &w));
            prop_assert!(a < w.len());
            if w.iter().any(|x| *x > 0.0) {
                prop_assert!(w[a] > 0.0);
            }
        }
    }
}
