//! The review page of a drafted suite, as Markdown and as HTML (every text from the server or a model escaped): a
//! summary, then the kept tasks grouped by tool (request, split, check, reference call, start of its result),
//! then the dropped ones with their reasons. Meant to be read in five minutes before the suite is used.

use crate::draft::{DraftOutcome, Dropped, Kept, TaskCheck};
use crate::parse::Check;
use std::collections::BTreeMap;

fn check_text(c: &TaskCheck) -> String {
    match c {
        TaskCheck::Answer(Check::Number(n)) => format!("answer: the number {n}"),
        TaskCheck::Answer(Check::Contains(s)) => format!("answer: mentions {s:?}"),
        TaskCheck::Routing(why) => format!("routing only ({why})"),
    }
}

fn call_text(k: Option<&tooltune_evaluator::ReferenceCall>) -> String {
    k.map(|c| format!("{}({})", c.tool, c.arguments))
        .unwrap_or_else(|| "none".into())
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Groups kept tasks by owner (no owner last).
fn groups(o: &DraftOutcome) -> Vec<(String, Vec<&Kept>)> {
    let mut m: BTreeMap<(bool, String), Vec<&Kept>> = BTreeMap::new();
    for k in &o.kept {
        let key = match &k.owner {
            Some(t) => (false, t.clone()),
            None => (true, "no tool (answer directly)".to_string()),
        };
        m.entry(key).or_default().push(k);
    }
    m.into_iter().map(|((_, t), v)| (t, v)).collect()
}

fn summary_lines(o: &DraftOutcome) -> Vec<String> {
    let reasons = o
        .dropped_by_reason()
        .iter()
        .map(|(r, n)| format!("{n} {r}"))
        .collect::<Vec<_>>()
        .join(", ");
    vec![
        format!("Drafted with {} in {:.0} s.", o.model, o.seconds),
        format!(
            "Tools: {}.",
            o.tools
                .iter()
                .map(|(n, a)| format!("{n} ({})", a.describe()))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        format!("Exploration calls: {}.", o.explored.len()),
        format!(
            "Requests drafted: {}; kept {} ({} with an answer check, {} routing only); dropped {}{}.",
            o.drafted(),
            o.kept.len(),
            o.answer_checked(),
            o.kept.len() - o.answer_checked(),
            o.dropped.len(),
            if reasons.is_empty() {
                String::new()
            } else {
                format!(" ({reasons})")
            }
        ),
        if o.existing > 0 {
            format!("The suite held {} tasks before; they are not shown.", o.existing)
        } else {
            String::new()
        },
        if o.stopped {
            "Stopped early (Ctrl-C): only what was verified by then is in the suite.".into()
        } else {
            String::new()
        },
    ]
    .into_iter()
    .filter(|l| !l.is_empty())
    .collect()
}

/// The review page as Markdown.
pub fn markdown(title: &str, o: &DraftOutcome) -> String {
    let code = |s: &str| format!("`{}`", one_line(s).replace('`', "'"));
    let mut s = format!("# Drafted suite `{title}`: review\n\n");
    for l in summary_lines(o) {
        s.push_str(&format!("{l}  \n"));
    }
    for (tool, tasks) in groups(o) {
        s.push_str(&format!("\n## {tool} ({} tasks)\n\n", tasks.len()));
        for k in tasks {
            s.push_str(&format!(
                "- **{}** ({}, {}): {}\n",
                k.id,
                k.split,
                k.kind.name(),
                one_line(&k.prompt)
            ));
            s.push_str(&format!("  - check: {}\n", check_text(&k.check)));
            if k.reference.is_some() {
                s.push_str(&format!(
                    "  - reference: {}\n",
                    code(&call_text(k.reference.as_ref()))
                ));
            }
            if let Some(r) = &k.result_start {
                s.push_str(&format!("  - result: {}\n", code(r)));
            }
        }
    }
    if !o.dropped.is_empty() {
        s.push_str(&format!("\n## Dropped ({})\n\n", o.dropped.len()));
        for d in &o.dropped {
            s.push_str(&dropped_md(d, &code));
        }
    }
    s
}

fn dropped_md(d: &Dropped, code: &dyn Fn(&str) -> String) -> String {
    let mut s = format!(
        "- {} (for {}, {}): **{}**: {}\n",
        one_line(&d.prompt),
        d.owner.as_deref().unwrap_or("no tool"),
        d.kind.name(),
        d.reason.key(),
        one_line(&d.detail)
    );
    if d.reference.is_some() {
        s.push_str(&format!(
            "  - reference: {}\n",
            code(&call_text(d.reference.as_ref()))
        ));
    }
    if let Some(r) = &d.result_start {
        s.push_str(&format!("  - result: {}\n", code(r)));
    }
    s
}

/// Escapes text for HTML element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The review page as a self-contained HTML file.
pub fn html(title: &str, o: &DraftOutcome) -> String {
    let e = escape;
    let mut s = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Drafted suite {t}: review</title>\n\
         <style>body{{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.4}}\
         table{{border-collapse:collapse;width:100%;margin-bottom:1.5rem}}td,th{{border:1px solid #ccc;padding:.3rem .5rem;\
         vertical-align:top;text-align:left}}code{{font-size:.85em;white-space:pre-wrap;word-break:break-word}}\
         .answer{{color:#064}}.routing{{color:#555}}.reason{{color:#a00}}</style></head><body>\n\
         <h1>Drafted suite <code>{t}</code>: review</h1>\n",
        t = e(title)
    );
    for l in summary_lines(o) {
        s.push_str(&format!("<p>{}</p>\n", e(&l)));
    }
    for (tool, tasks) in groups(o) {
        s.push_str(&format!(
            "<h2>{} ({} tasks)</h2>\n<table><tr><th>task</th><th>request</th><th>check</th>\
                             <th>reference call</th><th>start of result</th></tr>\n",
            e(&tool),
            tasks.len()
        ));
        for k in tasks {
            let class = if matches!(k.check, TaskCheck::Answer(_)) {
                "answer"
            } else {
                "routing"
            };
            s.push_str(&format!(
                "<tr><td><code>{}</code><br>{}, {}</td><td>{}</td><td class=\"{class}\">{}</td><td><code>{}</code></td>\
                 <td><code>{}</code></td></tr>\n",
                e(&k.id),
                e(&k.split.to_string()),
                e(k.kind.name()),
                e(&k.prompt),
                e(&check_text(&k.check)),
                e(&call_text(k.reference.as_ref())),
                e(k.result_start.as_deref().unwrap_or(""))
            ));
        }
        s.push_str("</table>\n");
    }
    if !o.dropped.is_empty() {
        s.push_str(&format!(
            "<h2>Dropped ({})</h2>\n<table><tr><th>request</th><th>for</th><th>reason</th><th>reference call</th>\
             <th>start of result</th></tr>\n",
            o.dropped.len()
        ));
        for d in &o.dropped {
            s.push_str(&format!(
                "<tr><td>{}</td><td>{}<br>{}</td><td class=\"reason\">{}: {}</td><td><code>{}</code></td>\
                 <td><code>{}</code></td></tr>\n",
                e(&d.prompt),
                e(d.owner.as_deref().unwrap_or("no tool")),
                e(d.kind.name()),
                e(&d.reason.key()),
                e(&d.detail),
                e(&call_text(d.reference.as_ref())),
                e(d.result_start.as_deref().unwrap_or(""))
            ));
        }
        s.push_str("</table>\n");
    }
    s.push_str("</body></html>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draft::{DropReason, Kind};
    use crate::tools::Access;
    use tooltune_evaluator::{ReferenceCall, Split};

    fn outcome() -> DraftOutcome {
        DraftOutcome {
            suite: None,
            review_md: "r.md".into(),
            review_html: "r.html".into(),
            model: "fake-model".into(),
            tools: vec![("read_file".into(), Access::ReadOnly)],
            explored: Vec::new(),
            existing: 0,
            kept: vec![Kept {
                id: "read_file-team".into(),
                prompt: "Who is on the <b>team</b>?".into(),
                split: Split::Test,
                owner: Some("read_file".into()),
                kind: Kind::Tool,
                check: TaskCheck::Answer(Check::Contains("Joon Lee".into())),
                reference: Some(ReferenceCall {
                    tool: "read_file".into(),
                    arguments: serde_json::json!({"path": "team.txt"}),
                }),
                result_start: Some("Joon Lee <script>alert(1)</script>".into()),
                digest: None,
                model: "fake-model".into(),
            }],
            dropped: vec![Dropped {
                prompt: "Read the moon file".into(),
                owner: Some("read_file".into()),
                kind: Kind::Tool,
                reason: DropReason::ToolError,
                detail: "`read_file` answered with an error".into(),
                reference: None,
                result_start: Some("no such file".into()),
            }],
            stopped: false,
            seconds: 12.0,
        }
    }

    #[test]
    fn html_escapes_everything_from_the_server_and_the_model() {
        let h = html("demo", &outcome());
        assert!(!h.contains("<script>") && !h.contains("<b>team"), "{h}");
        assert!(h.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{h}");
        assert!(
            h.contains("<h2>read_file (1 tasks)</h2>") && h.contains("<h2>Dropped (1)</h2>"),
            "{h}"
        );
        assert!(h.contains("tool-error"), "{h}");
    }

    #[test]
    fn markdown_groups_by_tool_and_ends_with_the_dropped() {
        let m = markdown("demo", &outcome());
        let tool = m.find("## read_file").expect("tool section");
        let dropped = m.find("## Dropped (1)").expect("dropped section");
        assert!(tool < dropped);
        assert!(m.contains("answer: mentions \"Joon Lee\""), "{m}");
        assert!(m.contains("`read_file({\"path\":\"team.txt\"})`"), "{m}");
        assert!(m.contains("1 with an answer check, 0 routing only"), "{m}");
    }
}
