//! Derives the MetaTool catalog suites (`datasets/suites/metatool/`) from the benchmark's two public files: groups
//! of confusable tools chosen by a rule fixed before any tuning, each tool's queries split into train, validation
//! and test with a fixed seed. Re-running it on the same files writes the same suites, byte for byte.
//!
//! ```sh
//! cargo run --release --example metatool_import -- ../shared/external/metatool datasets/suites/metatool
//! ```
//!
//! The rule (also in docs/benchmarks.md), chosen before any result was seen and not to be changed after:
//! 1. Each tool is a bag of words: its published description plus every query labelled with it, lower-cased,
//!    words of two letters or more, English stop words left out; weighted by TF-IDF over the 199 tools and
//!    normalised. Two tools are alike by the cosine of their vectors. (MetaTool's own "similar choices" task
//!    ranks by description embeddings; a model-free measure keeps the rule reproducible without one, and the
//!    queries make it about the requests the tools are confused on, not only their wording.)
//! 2. Tools with fewer than 24 queries are left out (one per split is not enough).
//! 3. Groups of six, greedily: the most alike pair of tools not yet grouped starts a group, and the ungrouped
//!    tool with the highest mean likeness to the group's members joins until it has six; ties go to the name
//!    that sorts first. Ten groups are made; they are numbered in the order they were formed (g01 the most
//!    confusable).
//! 4. Per tool, its queries in a fixed pseudo-random order (seed 47 and the tool's name): 6 train, 6 validation,
//!    12 test; the rest are not used. About a fifth of each tool's queries were already kept aside in the copy of
//!    the data (see its README) for later checks.

use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const GROUPS: usize = 10;
const GROUP_SIZE: usize = 6;
const TRAIN: usize = 6;
const VALIDATION: usize = 6;
const TEST: usize = 12;
const MIN_QUERIES: usize = TRAIN + VALIDATION + TEST;
const SEED: u64 = 47;

const STOP: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "can", "could", "do", "does", "for", "from",
    "get", "give", "have", "help", "how", "i", "if", "in", "is", "it", "its", "me", "my", "of",
    "on", "or", "please", "show", "some", "that", "the", "this", "to", "use", "what", "when",
    "where", "which", "who", "with", "would", "you", "your", "any", "about", "find", "there",
    "want", "need", "know", "tell", "like", "will", "all", "our", "we", "us", "into", "than",
    "then", "them", "they", "their", "be", "been", "was", "were", "so", "up",
];

fn words(text: &str) -> Vec<String> {
    text.to_lowercase()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| w.len() >= 2 && !STOP.contains(w))
        .map(str::to_string)
        .collect()
}

/// SplitMix64: a small, fully specified generator, so the order does not depend on a crate's version.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn seeded(name: &str) -> u64 {
    // FNV-1a of the name, mixed with the fixed seed.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^ SEED
}

fn shuffle<T>(v: &mut [T], name: &str) {
    let mut state = seeded(name);
    for i in (1..v.len()).rev() {
        let j = (splitmix(&mut state) % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

#[derive(Serialize)]
struct SuiteFile {
    name: String,
    description: String,
    tool: Vec<ToolEntry>,
    task: Vec<TaskEntry>,
}

#[derive(Serialize)]
struct ToolEntry {
    name: String,
    description: String,
    input_schema: serde_json::Value,
}

#[derive(Serialize)]
struct TaskEntry {
    id: String,
    prompt: String,
    split: &'static str,
    owner: String,
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [from, to] = args.as_slice() else {
        return Err(
            "usage: metatool_import METATOOL_DIR OUT_DIR (see the file's first lines)".into(),
        );
    };
    let (from, to) = (PathBuf::from(from), PathBuf::from(to));
    let descriptions: BTreeMap<String, String> = {
        let p = from.join("plugin_des.json");
        let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?
    };
    let queries = read_queries(&from.join("all_clean_data.csv"), &descriptions)?;
    let eligible: Vec<&String> = queries
        .iter()
        .filter(|(_, q)| q.len() >= MIN_QUERIES)
        .map(|(t, _)| t)
        .collect();
    let sim = similarities(&eligible, &descriptions, &queries);
    let groups = make_groups(&eligible, &sim);
    std::fs::create_dir_all(&to).map_err(|e| format!("{}: {e}", to.display()))?;
    let mut index = String::from("| group | tools | most alike pair (cosine) |\n|---|---|---|\n");
    for (g, members) in groups.iter().enumerate() {
        let name = format!("metatool-g{:02}", g + 1);
        let tools: Vec<&String> = members.iter().map(|&i| eligible[i]).collect();
        let suite = suite_for(&name, &tools, &descriptions, &queries);
        let body = toml::to_string(&suite).map_err(|e| format!("{name}: {e}"))?;
        let text = format!(
            "# MetaTool (Huang et al., ICLR 2024; MIT licence): group {} of {GROUPS}, derived by\n\
             # `cargo run --release --example metatool_import` with the rule in docs/benchmarks.md.\n\
             # Do not edit by hand: re-run the importer.\n\n{body}",
            g + 1
        );
        let path = to.join(format!("{name}.toml"));
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        let (a, b, s) = best_pair(members, &sim);
        index.push_str(&format!(
            "| {name} | {} | {} / {} ({s:.2}) |\n",
            tools
                .iter()
                .map(|t| format!("`{t}`"))
                .collect::<Vec<_>>()
                .join(", "),
            eligible[a],
            eligible[b]
        ));
        println!(
            "{}: {}",
            path.display(),
            tools
                .iter()
                .map(|t| t.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    // The queries and descriptions are MetaTool's (MIT): its licence travels with the derived suites.
    let licence = from.join("LICENSE");
    std::fs::copy(&licence, to.join("LICENSE"))
        .map_err(|e| format!("{}: {e}", licence.display()))?;
    let path = to.join("GROUPS.md");
    std::fs::write(&path, index).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(())
}

fn read_queries(
    path: &Path,
    descriptions: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, Vec<String>>, String> {
    let mut reader =
        csv::Reader::from_path(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for (i, row) in reader.records().enumerate() {
        let row = row.map_err(|e| format!("{}: record {}: {e}", path.display(), i + 1))?;
        let (Some(query), Some(tool)) = (row.get(0), row.get(1)) else {
            return Err(format!(
                "{}: record {}: expected Query,Tool",
                path.display(),
                i + 1
            ));
        };
        if !descriptions.contains_key(tool) {
            return Err(format!(
                "{}: record {}: tool `{tool}` has no description in plugin_des.json",
                path.display(),
                i + 1
            ));
        }
        let query = query.trim().to_string();
        // The same query twice for one tool would be one task in two splits.
        if !query.is_empty() && seen.insert((tool.to_string(), query.clone())) {
            out.entry(tool.to_string()).or_default().push(query);
        }
    }
    Ok(out)
}

fn similarities(
    tools: &[&String],
    descriptions: &BTreeMap<String, String>,
    queries: &BTreeMap<String, Vec<String>>,
) -> Vec<Vec<f64>> {
    let bags: Vec<BTreeMap<String, f64>> = tools
        .iter()
        .map(|t| {
            let mut bag = BTreeMap::new();
            let text = std::iter::once(descriptions[*t].as_str())
                .chain(queries[*t].iter().map(String::as_str));
            for s in text {
                for w in words(s) {
                    *bag.entry(w).or_insert(0.0) += 1.0;
                }
            }
            bag
        })
        .collect();
    let mut df: BTreeMap<&str, f64> = BTreeMap::new();
    for bag in &bags {
        for w in bag.keys() {
            *df.entry(w.as_str()).or_insert(0.0) += 1.0;
        }
    }
    let n = bags.len() as f64;
    let vectors: Vec<BTreeMap<&str, f64>> = bags
        .iter()
        .map(|bag| {
            let mut v: BTreeMap<&str, f64> = bag
                .iter()
                .map(|(w, tf)| (w.as_str(), (1.0 + tf.ln()) * (n / df[w.as_str()]).ln()))
                .collect();
            let norm = v.values().map(|x| x * x).sum::<f64>().sqrt();
            if norm > 0.0 {
                v.values_mut().for_each(|x| *x /= norm);
            }
            v
        })
        .collect();
    (0..vectors.len())
        .map(|i| {
            (0..vectors.len())
                .map(|j| {
                    vectors[i]
                        .iter()
                        .filter_map(|(w, x)| vectors[j].get(w).map(|y| x * y))
                        .sum()
                })
                .collect()
        })
        .collect()
}

fn make_groups(tools: &[&String], sim: &[Vec<f64>]) -> Vec<Vec<usize>> {
    let mut used = vec![false; tools.len()];
    let mut groups = Vec::new();
    while groups.len() < GROUPS {
        // The most alike free pair; ties to the names that sort first.
        let mut best: Option<(usize, usize)> = None;
        for i in 0..tools.len() {
            for j in i + 1..tools.len() {
                if used[i] || used[j] {
                    continue;
                }
                let better = match best {
                    None => true,
                    Some((a, b)) => {
                        sim[i][j] > sim[a][b]
                            || (sim[i][j] == sim[a][b]
                                && (tools[i], tools[j]) < (tools[a], tools[b]))
                    }
                };
                if better {
                    best = Some((i, j));
                }
            }
        }
        let Some((a, b)) = best else { break };
        let mut group = vec![a, b];
        used[a] = true;
        used[b] = true;
        while group.len() < GROUP_SIZE {
            let mean =
                |k: usize| group.iter().map(|&m| sim[k][m]).sum::<f64>() / group.len() as f64;
            let next = (0..tools.len())
                .filter(|&k| !used[k])
                .max_by(|&x, &y| mean(x).total_cmp(&mean(y)).then(tools[y].cmp(tools[x])));
            let Some(k) = next else { break };
            used[k] = true;
            group.push(k);
        }
        groups.push(group);
    }
    groups
}

fn best_pair(members: &[usize], sim: &[Vec<f64>]) -> (usize, usize, f64) {
    let mut best = (members[0], members[1], f64::NEG_INFINITY);
    for (x, &i) in members.iter().enumerate() {
        for &j in &members[x + 1..] {
            if sim[i][j] > best.2 {
                best = (i, j, sim[i][j]);
            }
        }
    }
    best
}

fn suite_for(
    name: &str,
    tools: &[&String],
    descriptions: &BTreeMap<String, String>,
    queries: &BTreeMap<String, Vec<String>>,
) -> SuiteFile {
    let mut task = Vec::new();
    for t in tools {
        let mut q = queries[*t].clone();
        shuffle(&mut q, t);
        let slug: String = t
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .collect();
        for (i, query) in q.into_iter().take(MIN_QUERIES).enumerate() {
            let (split, n) = if i < TRAIN {
                ("train", i)
            } else if i < TRAIN + VALIDATION {
                ("validation", i - TRAIN)
            } else {
                ("test", i - TRAIN - VALIDATION)
            };
            task.push(TaskEntry {
                id: format!("{slug}-{split}-{:02}", n + 1),
                prompt: query,
                split,
                owner: (*t).clone(),
            });
        }
    }
    SuiteFile {
        name: name.to_string(),
        description: format!(
            "MetaTool tools alike by description and queries ({}); every tool under study; routing only",
            tools.iter().map(|t| t.as_str()).collect::<Vec<_>>().join(", ")
        ),
        tool: tools
            .iter()
            .map(|t| ToolEntry {
                name: (*t).clone(),
                description: descriptions[*t].clone(),
                // MetaTool publishes no schemas: every tool takes the user's request, the same for all, so the
                // schema says nothing that tells them apart.
                input_schema: serde_json::json!({
                    "type": "object",
                    "properties": {"query": {"type": "string", "description": "What the user asked for."}},
                    "required": ["query"],
                }),
            })
            .collect(),
        task,
    }
}
