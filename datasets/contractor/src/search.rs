//! A small BM25 keyword search over a folder of Markdown documents, split into paragraphs.
//!
//! Each tool of the contractor server searches its own corpus with the same engine, so the only thing that
//! tells the two tools apart to a model is their description: exactly the situation tooltune studies.

use std::collections::HashMap;
use std::path::Path;

/// How many passages a search returns.
pub const TOP_K: usize = 3;

const K1: f64 = 1.2;
const B: f64 = 0.75;

// Words that carry no topic; without this list "what is the" would rank every passage.
const STOPWORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "does", "do", "for", "from", "how", "in",
    "is", "it", "its", "many", "much", "of", "on", "or", "our", "the", "to", "was", "we", "what",
    "when", "which", "who", "with", "long", "tell", "me", "there", "this", "that", "after",
    "before",
];

/// One searchable paragraph.
#[derive(Debug, Clone)]
struct Passage {
    title: String,
    text: String,
    terms: HashMap<String, usize>,
    len: usize,
}

/// An index over one corpus.
#[derive(Debug, Clone)]
pub struct Index {
    passages: Vec<Passage>,
    doc_freq: HashMap<String, usize>,
    avg_len: f64,
}

/// Strips the commonest English plural endings so "retries" finds "retry" and "orders" finds "order".
fn stem(w: &str) -> String {
    if w.len() > 4
        && let Some(base) = w.strip_suffix("ies")
    {
        return format!("{base}y");
    }
    if w.len() > 3 && w.ends_with('s') && !w.ends_with("ss") && !w.ends_with("us") {
        return w[..w.len() - 1].to_string();
    }
    w.to_string()
}

/// Splits text into lowercase, lightly stemmed search terms; `sync_orders` yields `sync`, `order` and
/// `sync_orders`.
pub fn terms(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for raw in text.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
        let w = raw.trim_matches('_').to_lowercase();
        if w.is_empty() || STOPWORDS.contains(&w.as_str()) {
            continue;
        }
        if w.contains('_') {
            out.extend(
                w.split('_')
                    .filter(|p| !p.is_empty() && !STOPWORDS.contains(p))
                    .map(stem),
            );
            out.push(w);
        } else {
            out.push(stem(&w));
        }
    }
    out
}

impl Index {
    /// Indexes every `*.md` file in `dir`: the first `# ` line is the title, blank-line separated
    /// paragraphs after it are passages.
    pub fn load(dir: &Path) -> std::io::Result<Self> {
        let mut files: Vec<_> = std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        files.sort();
        let mut passages = Vec::new();
        for f in files {
            let text = std::fs::read_to_string(&f)?;
            let mut title = f
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            for para in text.split("\n\n") {
                let para = para.trim();
                if para.is_empty() {
                    continue;
                }
                if let Some(t) = para.strip_prefix("# ") {
                    title = t.trim().to_string();
                    continue;
                }
                passages.push(Passage::new(title.clone(), para.to_string()));
            }
        }
        Ok(Index::from_passages(passages))
    }

    fn from_passages(passages: Vec<Passage>) -> Self {
        let mut doc_freq: HashMap<String, usize> = HashMap::new();
        for p in &passages {
            for t in p.terms.keys() {
                *doc_freq.entry(t.clone()).or_default() += 1;
            }
        }
        let total: usize = passages.iter().map(|p| p.len).sum();
        let avg_len = if passages.is_empty() {
            1.0
        } else {
            total as f64 / passages.len() as f64
        };
        Index {
            passages,
            doc_freq,
            avg_len,
        }
    }

    /// Number of passages indexed.
    pub fn len(&self) -> usize {
        self.passages.len()
    }

    /// The best [`TOP_K`] passages for a query, formatted for a model; a message when nothing matches.
    pub fn search(&self, query: &str) -> String {
        let q = terms(query);
        let n = self.passages.len() as f64;
        let mut scored: Vec<(f64, usize)> = self
            .passages
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut s = 0.0;
                for t in &q {
                    let Some(&tf) = p.terms.get(t) else { continue };
                    let df = self.doc_freq.get(t).copied().unwrap_or(0) as f64;
                    let idf = ((n - df + 0.5) / (df + 0.5) + 1.0).ln();
                    let tf = tf as f64;
                    s += idf * tf * (K1 + 1.0)
                        / (tf + K1 * (1.0 - B + B * p.len as f64 / self.avg_len));
                }
                (s, i)
            })
            .filter(|(s, _)| *s > 0.0)
            .collect();
        // Ties keep corpus order, so results are deterministic.
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        if scored.is_empty() {
            return format!("No results for {query:?}.");
        }
        scored
            .iter()
            .take(TOP_K)
            .map(|(_, i)| {
                let p = &self.passages[*i];
                // No rank numbers: they would read as facts ("[3]") to a model and to the answer checks.
                format!("## {}\n{}", p.title, p.text)
            })
            .collect::<Vec<_>>()
            .join("\n\n")
    }
}

impl Passage {
    fn new(title: String, text: String) -> Self {
        let mut terms_map: HashMap<String, usize> = HashMap::new();
        let all = terms(&format!("{title} {text}"));
        let len = all.len();
        for t in all {
            *terms_map.entry(t).or_default() += 1;
        }
        Passage {
            title,
            text,
            terms: terms_map,
            len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index() -> Index {
        Index::from_passages(vec![
            Passage::new("Billing".into(), "The SDK retries at most 7 times.".into()),
            Passage::new(
                "API".into(),
                "sync_orders is limited to 120 requests.".into(),
            ),
            Passage::new("Weather".into(), "Porto: high of 24 degrees.".into()),
        ])
    }

    #[test]
    fn terms_split_snake_case_and_drop_stopwords() {
        assert_eq!(
            terms("What is the sync_orders limit?"),
            vec!["sync", "order", "sync_orders", "limit"]
        );
    }

    #[test]
    fn ranks_the_matching_passage_first() {
        let i = index();
        let r = i.search("what is the retry limit of the SDK");
        assert!(r.starts_with("## Billing\nThe SDK retries"), "{r}");
        let r = i.search("rate limit of sync orders");
        assert!(r.starts_with("## API"), "{r}");
        assert!(!r.contains("Porto"), "{r}");
    }

    #[test]
    fn says_so_when_nothing_matches() {
        assert_eq!(index().search("zebra"), "No results for \"zebra\".");
    }
}
