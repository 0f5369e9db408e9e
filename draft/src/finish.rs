//! The last stage, shared by `suite draft` and `suite from-traces`: ids and splits for the kept tasks, the suite's
//! text (a new header, or the existing file with the new tasks appended for `--more`), read back by the
//! evaluator's loader and written atomically, and the review pages beside it, which cover every task of the file.

use crate::outcome::{DraftOutcome, Kept, Kind, Origin, TaskCheck};
use crate::parse::{self, Check};
use crate::{DraftError, review, split, write};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use tooltune_evaluator::fixture::Fixture;
use tooltune_evaluator::{ServerSpec, Suite, Transport};

/// What the suite file is written from.
pub(crate) struct SuiteFile<'a> {
    /// The file.
    pub out: &'a Path,
    /// The suite's name (default: the file name).
    pub name: Option<&'a str>,
    /// The server the tasks were verified on; `None` when none was given (from-traces without one).
    pub server: Option<&'a ServerSpec>,
    /// The fixture.
    pub fixture: Option<&'a Fixture>,
    /// The protocol revision that worked.
    pub protocol: Option<&'a str>,
    /// Every tool, in the server's order.
    pub tools: &'a [String],
    /// The suite at `out` that the new tasks are appended to (`--more`).
    pub existing: Option<&'a Suite>,
    /// The opening comment of a new file, and its `description`.
    pub opening: &'a str,
    /// The `description` of a new file.
    pub description: String,
    /// The comment line above the tasks appended with `--more`.
    pub appended: String,
}

/// Gives the new tasks their splits (stratified by owner, counting what `existing` holds) and ids (unique in the
/// file).
pub(crate) fn ids_and_splits(kept: Vec<Kept>, existing: Option<&Suite>, seed: u64) -> Vec<Kept> {
    let mut used: BTreeSet<String> = existing
        .map(|s| s.tasks.iter().map(|t| t.id.clone()).collect())
        .unwrap_or_default();
    let mut counts: BTreeMap<Option<String>, split::Counts> = BTreeMap::new();
    if let Some(s) = existing {
        for t in &s.tasks {
            *counts
                .entry(t.owner.clone())
                .or_default()
                .entry(t.split)
                .or_default() += 1;
        }
    }
    let owners: Vec<Option<String>> = kept.iter().map(|k| k.owner.clone()).collect();
    let splits = split::assign(&owners, &counts, seed);
    kept.into_iter()
        .zip(splits)
        .map(|(mut k, s)| {
            k.split = s;
            k.id = unique_id(&k, &mut used);
            k
        })
        .collect()
}

/// The tasks of a suite as the review page shows them (`--more`: the ones written before this run).
pub(crate) fn earlier(suite: &Suite) -> Vec<Kept> {
    suite
        .tasks
        .iter()
        .map(|t| {
            let check = match &t.answer {
                Some(a) => match (a.number, a.contains.as_slice()) {
                    (Some(n), _) => TaskCheck::Answer(Check::Number(n)),
                    (None, [one]) => TaskCheck::Answer(Check::Contains(one.clone())),
                    _ => TaskCheck::Routing("an answer check written by hand".into()),
                },
                None => TaskCheck::Routing("no answer check".into()),
            };
            let kind = match (
                &t.owner,
                t.provenance.as_ref().and_then(|p| p.against.clone()),
            ) {
                (None, _) => Kind::NoTool,
                (Some(_), Some(against)) => Kind::Confusable { against },
                (Some(_), None) => Kind::Tool,
            };
            Kept {
                id: t.id.clone(),
                prompt: t.prompt.clone(),
                split: t.split,
                owner: t.owner.clone(),
                kind,
                check,
                reference: t.reference.clone(),
                result_start: None,
                digest: t
                    .provenance
                    .as_ref()
                    .and_then(|p| p.reference_sha256.clone()),
                origin: Origin::Earlier,
            }
        })
        .collect()
}

/// Writes the suite (when a task was kept) and the review pages, and sets `outcome.suite`. The suite's text is
/// read back by the loader first: a file it refuses is never written.
pub(crate) fn write_files(file: &SuiteFile, outcome: &mut DraftOutcome) -> Result<(), DraftError> {
    if !outcome.kept.is_empty() {
        let text = suite_text(file, outcome)?;
        Suite::parse(file.out, &text).map_err(|e| {
            DraftError::Internal(format!(
                "the written suite does not load ({e}); this is a bug in tooltune's suite writer"
            ))
        })?;
        write::atomically(file.out, &text)?;
        outcome.suite = Some(file.out.to_path_buf());
    }
    let title = file
        .name
        .map(str::to_string)
        .unwrap_or_else(|| file_stem(file.out));
    write::atomically(&outcome.review_md, &review::markdown(&title, outcome))?;
    write::atomically(&outcome.review_html, &review::html(&title, outcome))?;
    Ok(())
}

/// The review pages beside a suite file.
pub(crate) fn review_paths(out: &Path) -> (PathBuf, PathBuf) {
    (
        out.with_extension("review.md"),
        out.with_extension("review.html"),
    )
}

/// An id from the owner and the request's first words, unique among `used` (which it joins).
pub(crate) fn unique_id(k: &Kept, used: &mut BTreeSet<String>) -> String {
    let prefix = match (&k.owner, &k.kind) {
        (None, _) => "no-tool".to_string(),
        (Some(o), Kind::Confusable { against }) => format!("{o}-not-{against}"),
        (Some(o), _) => o.clone(),
    };
    let words: Vec<String> = parse::normalise(&k.prompt)
        .split(' ')
        .filter(|w| {
            w.len() > 2
                && ![
                    "the", "and", "what", "for", "are", "can", "you", "how", "please", "with",
                ]
                .contains(w)
        })
        .take(4)
        .map(str::to_string)
        .collect();
    let base: String = format!("{prefix}-{}", words.join("-"))
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let base = base.trim_end_matches('-').to_string();
    let mut id = base.clone();
    let mut n = 2;
    while used.contains(&id) {
        id = format!("{base}-{n}");
        n += 1;
    }
    used.insert(id.clone());
    id
}

fn suite_text(file: &SuiteFile, o: &DraftOutcome) -> Result<String, DraftError> {
    let mut text = if file.existing.is_some() {
        let mut t = std::fs::read_to_string(file.out).map_err(|e| DraftError::Write {
            path: file.out.to_path_buf(),
            message: e.to_string(),
        })?;
        if !t.ends_with('\n') {
            t.push('\n');
        }
        t.push_str(&format!("\n# ---- {} ----\n", file.appended));
        t
    } else {
        let suite_dir = file
            .out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        std::fs::create_dir_all(&suite_dir).map_err(|e| DraftError::Write {
            path: suite_dir.clone(),
            message: e.to_string(),
        })?;
        let bin = tooltune_evaluator::suite::bin_dir();
        let third = tooltune_evaluator::suite::third_party_dir(&suite_dir);
        let port = |w: &str| write::portable(w, &suite_dir, &bin, &third);
        let (command, args, url) = match file.server.map(|s| &s.transport) {
            Some(Transport::Stdio { command, args, .. }) => (
                Some(port(command.as_str())),
                args.iter().map(|a| port(a.as_str())).collect::<Vec<_>>(),
                None,
            ),
            Some(Transport::Http { url, .. }) => (None, Vec::new(), Some(url.clone())),
            // Drafting explores a running server; a catalog never gets here (nothing to explore).
            Some(Transport::Catalog { .. }) | None => (None, Vec::new(), None),
        };
        let fixture_path = file.fixture.map(|f| {
            suite_dir
                .canonicalize()
                .map(|base| write::relative(&f.source, &base).display().to_string())
                .unwrap_or_else(|_| f.source.display().to_string())
        });
        let name = file
            .name
            .map(str::to_string)
            .unwrap_or_else(|| file_stem(file.out));
        let review = o
            .review_md
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        write::header(&write::Header {
            opening: &file.opening.replace("{review}", &review),
            name: &name,
            description: &file.description,
            tools: file.tools,
            fixture: fixture_path.as_deref(),
            command: command.as_deref().map(|c| (c, args.as_slice())),
            url: url.as_deref(),
            protocol: file.protocol,
        })
    };
    for k in &o.kept {
        text.push_str(&write::task(k, file.tools));
    }
    Ok(text)
}

pub(crate) fn file_stem(p: &Path) -> String {
    p.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "drafted".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tooltune_evaluator::Split;

    fn kept(owner: Option<&str>, prompt: &str) -> Kept {
        Kept {
            id: String::new(),
            prompt: prompt.into(),
            split: Split::Train,
            owner: owner.map(str::to_string),
            kind: Kind::Tool,
            check: TaskCheck::Routing("x".into()),
            reference: Vec::new(),
            result_start: None,
            digest: None,
            origin: Origin::Drafted {
                model: "fake".into(),
            },
        }
    }

    #[test]
    fn ids_come_from_owner_and_words_and_are_unique() {
        let mut used = BTreeSet::from(["read_file-notes-txt-file".to_string()]);
        let a = unique_id(
            &kept(Some("read_file"), "What's in the notes.txt file?"),
            &mut used,
        );
        assert_eq!(a, "read_file-notes-txt-file-2");
        let b = unique_id(&kept(None, "Tell me a joke about cats"), &mut used);
        assert_eq!(b, "no-tool-tell-joke-about-cats");
        assert!(!b.contains(char::is_whitespace));
    }
}
