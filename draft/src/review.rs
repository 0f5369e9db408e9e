//! The review page of a drafted suite, as Markdown and as HTML (every text from the server or a model escaped): a
//! summary, then the kept tasks grouped by tool (request, split, check, reference call, start of its result),
//! then the dropped ones with their reasons. Meant to be read in five minutes before the suite is used.

use crate::outcome::{DraftOutcome, Dropped, Kept, Kind, Origin, TaskCheck};
use crate::parse::Check;
use std::collections::BTreeMap;
use tooltune_core::text::escape_html;

fn check_text(c: &TaskCheck) -> String {
    match c {
        TaskCheck::Answer(Check::Number(n)) => format!("answer: the number {n}"),
        TaskCheck::Answer(Check::Contains(s)) => format!("answer: mentions {s:?}"),
        TaskCheck::Routing(why) => format!("routing only ({why})"),
    }
}

fn call_text(k: &[tooltune_evaluator::ReferenceCall]) -> String {
    if k.is_empty() {
        return "none".into();
    }
    k.iter()
        .map(|c| format!("{}({})", c.tool, c.arguments))
        .collect::<Vec<_>>()
        .join(", then ")
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Groups the file's tasks by owner (no owner last): the ones the suite held before (`--more`) first in each
/// group, then the new ones.
fn groups(o: &DraftOutcome) -> Vec<(String, Vec<&Kept>)> {
    let mut m: BTreeMap<(bool, String), Vec<&Kept>> = BTreeMap::new();
    for k in o.earlier.iter().chain(&o.kept) {
        let key = match &k.owner {
            Some(t) => (false, t.clone()),
            None => (true, "no tool (answer directly)".to_string()),
        };
        m.entry(key).or_default().push(k);
    }
    m.into_iter().map(|((_, t), v)| (t, v)).collect()
}

/// The tool a dropped task was for: a request from logs whose owner could not be read has none and is not a
/// no-tool request.
fn dropped_for(d: &Dropped) -> &str {
    match (&d.owner, &d.kind) {
        (Some(o), _) => o,
        (None, Kind::NoTool) => "no tool",
        (None, _) => "owner unknown",
    }
}

/// What the page reviews.
fn what(o: &DraftOutcome) -> &'static str {
    if o.traces.is_some() {
        "Suite from logs"
    } else {
        "Drafted suite"
    }
}

/// Where a task came from, after its split and kind.
fn origin_text(k: &Kept) -> &'static str {
    match &k.origin {
        Origin::Drafted { .. } => "",
        Origin::Logged { verified: true, .. } => ", from logs, verified",
        Origin::Logged {
            verified: false, ..
        } => ", from logs, not verified",
        Origin::Earlier => ", earlier",
    }
}

fn summary_lines(o: &DraftOutcome) -> Vec<String> {
    let reasons = o
        .dropped_by_reason()
        .iter()
        .map(|(r, n)| format!("{n} {r}"))
        .collect::<Vec<_>>()
        .join(", ");
    let made = match &o.traces {
        None => format!("Drafted with {} in {:.0} s.", o.model, o.seconds),
        Some(t) => format!(
            "Made by suite from-traces from {} logged runs ({} distinct requests) in {:.0} s; {}.",
            t.trajectories,
            t.requests,
            o.seconds,
            if t.verified {
                "each task's logged calls were run on the server"
            } else {
                "no server was given: the reference calls were not run (unverified)"
            }
        ),
    };
    vec![
        made,
        format!(
            "Tools: {}.",
            o.tools
                .iter()
                .map(|(n, a)| format!("{n} ({})", a.describe()))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        if o.traces.is_some() {
            String::new()
        } else {
            format!("Exploration calls: {}.", o.explored.len())
        },
        format!(
            "Requests {}: {}; kept {} ({} with an answer check, {} routing only); dropped {}{}.",
            if o.traces.is_some() {
                "logged"
            } else {
                "drafted"
            },
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
            format!(
                "The suite held {} tasks before; they are listed with the new ones, marked earlier (their reference \
                 calls were not run again).",
                o.existing
            )
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
    let mut s = format!("# {} `{title}`: review\n\n", what(o));
    for l in summary_lines(o) {
        s.push_str(&format!("{l}  \n"));
    }
    for (tool, tasks) in groups(o) {
        s.push_str(&format!("\n## {tool} ({} tasks)\n\n", tasks.len()));
        for k in tasks {
            s.push_str(&format!(
                "- **{}** ({}, {}{}): {}\n",
                k.id,
                k.split,
                k.kind.name(),
                origin_text(k),
                one_line(&k.prompt)
            ));
            s.push_str(&format!("  - check: {}\n", check_text(&k.check)));
            if !k.reference.is_empty() {
                s.push_str(&format!(
                    "  - reference: {}\n",
                    code(&call_text(&k.reference))
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
        dropped_for(d),
        d.kind.name(),
        d.reason.key(),
        one_line(&d.detail)
    );
    if !d.reference.is_empty() {
        s.push_str(&format!(
            "  - reference: {}\n",
            code(&call_text(&d.reference))
        ));
    }
    if let Some(r) = &d.result_start {
        s.push_str(&format!("  - result: {}\n", code(r)));
    }
    s
}

/// The review page as a self-contained HTML file.
pub fn html(title: &str, o: &DraftOutcome) -> String {
    let e = escape_html;
    let mut s = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{w} {t}: review</title>\n\
         <style>body{{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.4}}\
         table{{border-collapse:collapse;width:100%;margin-bottom:1.5rem}}td,th{{border:1px solid #ccc;padding:.3rem .5rem;\
         vertical-align:top;text-align:left}}code{{font-size:.85em;white-space:pre-wrap;word-break:break-word}}\
         .answer{{color:#064}}.routing{{color:#555}}.reason{{color:#a00}}</style></head><body>\n\
         <h1>{w} <code>{t}</code>: review</h1>\n",
        t = e(title),
        w = what(o)
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
                "<tr><td><code>{}</code><br>{}, {}{}</td><td>{}</td><td class=\"{class}\">{}</td><td><code>{}</code></td>\
                 <td><code>{}</code></td></tr>\n",
                e(&k.id),
                e(&k.split.to_string()),
                e(k.kind.name()),
                e(origin_text(k)),
                e(&k.prompt),
                e(&check_text(&k.check)),
                e(&call_text(&k.reference)),
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
                e(dropped_for(d)),
                e(d.kind.name()),
                e(&d.reason.key()),
                e(&d.detail),
                e(&call_text(&d.reference)),
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
    use crate::outcome::DropReason;
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
                reference: vec![ReferenceCall {
                    tool: "read_file".into(),
                    arguments: serde_json::json!({"path": "team.txt"}),
                }],
                result_start: Some("Joon Lee <script>alert(1)</script>".into()),
                digest: None,
                origin: Origin::Drafted {
                    model: "fake-model".into(),
                },
            }],
            dropped: vec![Dropped {
                prompt: "Read the moon file".into(),
                owner: Some("read_file".into()),
                kind: Kind::Tool,
                reason: DropReason::ToolError,
                detail: "`read_file` answered with an error".into(),
                reference: Vec::new(),
                result_start: Some("no such file".into()),
            }],
            earlier: Vec::new(),
            traces: None,
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
        // A request from logs whose owner could not be read is not called a no-tool request.
        let mut o = outcome();
        o.dropped[0].owner = None;
        o.dropped[0].reason = DropReason::NoSuccessfulRun;
        let m = markdown("demo", &o);
        assert!(
            m.contains("(for owner unknown, tool): **no-successful-run**"),
            "{m}"
        );
    }

    #[test]
    fn the_tasks_written_before_are_listed_with_the_new_ones() {
        let mut o = outcome();
        let mut old = o.kept[0].clone();
        old.id = "read_file-older-task".into();
        old.prompt = "Which file holds the team list?".into();
        old.origin = Origin::Earlier;
        old.result_start = None;
        o.earlier = vec![old];
        o.existing = 1;
        let m = markdown("demo", &o);
        let older = m.find("read_file-older-task").expect("earlier task listed");
        let newer = m.find("read_file-team").expect("new task listed");
        assert!(older < newer, "{m}");
        assert!(m.contains("## read_file (2 tasks)"), "{m}");
        assert!(m.contains("(test, tool, earlier)"), "{m}");
        let h = html("demo", &o);
        assert!(
            h.contains("read_file-older-task") && h.contains("<h2>read_file (2 tasks)</h2>"),
            "{h}"
        );
    }
}
