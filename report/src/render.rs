//! From figures to the HTML page: a view of each run with its numbers formatted and its untrusted text either left
//! to the template's auto-escaping or escaped here (fields named `*_html`, the only ones the template marks safe),
//! then the minijinja templates in `report/templates/`.

use crate::diff::word_diff_html;
use crate::highlight::{inflation_html, kind_label};
use crate::svg::{Chart, Point, Series, metric_chart};
use crate::verdict::{Outcome, fmt_rate, objective_label, pct};
use crate::{Report, RunReport, SideEffects, Step};
use minijinja::{Environment, UndefinedBehavior};
use serde::Serialize;
use tooltune_core::text::escape_html;
use tooltune_objectives::{Metrics, Rate};
use tooltune_run::{OriginKind, Status, TrialScore};

const PAGE: &str = include_str!("../templates/report.html.jinja");
const STYLE: &str = include_str!("../templates/style.css");

#[derive(Serialize)]
struct Page {
    title: String,
    runs: Vec<RunView>,
    compare_headers: Vec<String>,
    compare_rows: Vec<CompareRow>,
    tests: Vec<TestGroup>,
    verdicts: Vec<VerdictLine>,
}

#[derive(Serialize)]
struct CompareRow {
    label: String,
    cells: Vec<String>,
}

#[derive(Serialize)]
struct VerdictLine {
    run_id: String,
    objective: String,
    sentence: String,
    class: &'static str,
}

#[derive(Serialize)]
struct TestGroup {
    run_id: String,
    objective: String,
    tasks: u64,
    /// Held-out tasks rolled out (task success and the played rates are over these); fewer than `tasks` when
    /// the run screened the rest.
    rolled_out: u64,
    seed: TestSide,
    winner: TestSide,
    winner_label: String,
    p_success: String,
    p_selection: String,
    p_objective: String,
    p_routing: String,
    sig_success: bool,
    sig_selection: bool,
    sig_objective: bool,
    sig_routing: bool,
}

#[derive(Serialize)]
struct TestSide {
    success: String,
    selection: String,
    off_target: String,
    expected: String,
    routing: String,
}

#[derive(Serialize)]
struct RunView {
    run_id: String,
    anchor: String,
    objective: String,
    status: String,
    finished: bool,
    target: String,
    facts: Vec<(String, String)>,
    chart_html: String,
    grid_chart_html: String,
    series: Vec<SeriesRow>,
    steps: Vec<StepView>,
    candidates: Vec<CandidateView>,
    proposals: Vec<ProposalView>,
    verdict: Option<String>,
    verdict_class: &'static str,
    notes: Vec<String>,
    error: Option<String>,
    side_effects: Option<EffectsView>,
}

/// What rollouts did to the server's state, as sentences' parts. Tool names are untrusted: they stay plain strings
/// here and the template escapes them.
#[derive(Serialize)]
struct EffectsView {
    /// Each tool not declared read-only that rollouts called, with how many of them did.
    calls: Vec<String>,
    /// Each tool whose read-only hint a fixture's digest proved false, with how many rollouts showed it.
    violations: Vec<String>,
    /// Whether what the calls wrote could reach other rollouts.
    reach: String,
}

#[derive(Serialize)]
struct SeriesRow {
    iteration: usize,
    candidate: u32,
    rollouts: u64,
    tasks: u64,
    success: String,
    selection: String,
    off_target: String,
    expected: String,
    routing: String,
}

#[derive(Serialize)]
struct StepView {
    candidate: u32,
    title: String,
    badges: Vec<&'static str>,
    status: String,
    found_at: Option<u64>,
    diagnosis: Option<String>,
    description_html: String,
    diff_html: Option<String>,
    unchanged: bool,
    chars: usize,
    words: usize,
    promotional: u32,
    scope: u32,
    findings: Vec<FindingView>,
    validation: Option<TestSide>,
    other_changes: Vec<ChangeView>,
    side_effects: Option<EffectsView>,
}

#[derive(Serialize)]
struct FindingView {
    kind: &'static str,
    promotional: bool,
    text: String,
}

#[derive(Serialize)]
struct ChangeView {
    tool: String,
    diff_html: String,
}

#[derive(Serialize)]
struct CandidateView {
    id: u32,
    parents: String,
    origin: String,
    status: String,
    accepted: bool,
    validation_mean: String,
    chars: usize,
    promotional: u32,
    scope: u32,
    side_effect_calls: String,
    read_only_violations: String,
}

#[derive(Serialize)]
struct ProposalView {
    parent: u32,
    tool: String,
    outcome: String,
    diagnosis: Option<String>,
    description: Option<String>,
}

/// Renders the page; a template failure (a bug, the templates are fixed) still gives a page saying so.
pub(crate) fn html(report: &Report) -> String {
    let page = page(report);
    let render = || -> Result<String, minijinja::Error> {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_template("style.css", STYLE)?;
        // The `.html.jinja` name turns on minijinja's HTML auto-escaping for every value not marked safe.
        env.add_template("report.html.jinja", PAGE)?;
        env.get_template("report.html.jinja")?
            .render(minijinja::context! { page => page })
    };
    match render() {
        Ok(s) => s,
        Err(e) => format!(
            "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>tooltune report</title></head><body>\
             <p>The report could not be rendered: {}</p></body></html>",
            escape_html(&format!("{e:#}"))
        ),
    }
}

fn page(report: &Report) -> Page {
    // Side by side, every chart gets the same horizontal axis, so that equal spending sits at the same place.
    let common_x = report.runs.iter().map(|r| r.rollouts).max().unwrap_or(0);
    let runs: Vec<RunView> = report.runs.iter().map(|r| run_view(r, common_x)).collect();
    let compare_headers = report
        .runs
        .iter()
        .map(|r| format!("{} ({})", r.run_id, objective_label(r.objective)))
        .collect();
    let compare_rows = compare_rows(report);
    let tests = report.runs.iter().filter_map(test_group).collect();
    let verdicts = report
        .runs
        .iter()
        .map(|r| match &r.verdict {
            Some(v) => VerdictLine {
                run_id: r.run_id.clone(),
                objective: objective_label(r.objective).to_string(),
                sentence: v.sentence.clone(),
                class: verdict_class(v.outcome),
            },
            None => VerdictLine {
                run_id: r.run_id.clone(),
                objective: objective_label(r.objective).to_string(),
                sentence: format!(
                    "This run is unfinished (status: {}), so it has no winner yet and no verdict.",
                    r.status
                ),
                class: "unfinished",
            },
        })
        .collect();
    Page {
        title: if report.runs.len() == 1 {
            format!("tooltune report: run {}", report.runs[0].run_id)
        } else {
            format!("tooltune report: {} runs compared", report.runs.len())
        },
        runs,
        compare_headers,
        compare_rows,
        tests,
        verdicts,
    }
}

/// `None` when the rollouts called no tool that may write and no read-only hint was proved false.
fn effects_view(e: &SideEffects) -> Option<EffectsView> {
    if e.is_empty() {
        return None;
    }
    let counted = |m: &std::collections::BTreeMap<String, u64>| -> Vec<String> {
        m.iter()
            .map(|(tool, n)| {
                format!(
                    "{tool} (in {n} of {} rollout{})",
                    e.rollouts,
                    if e.rollouts == 1 { "" } else { "s" }
                )
            })
            .collect()
    };
    let reach = if e.on_fixture == e.rollouts {
        "Every rollout ran on a fresh copy of the suite's fixture, so no rollout saw what another wrote.".to_string()
    } else {
        format!(
            "{} of {} rollouts ran on a fresh copy of the suite's fixture; for the others, unless the suite resets              the server between rollouts ([reset]), later rollouts (and later candidates) may have seen what earlier              ones wrote, so their results may depend on the order they ran in.",
            e.on_fixture, e.rollouts
        )
    };
    Some(EffectsView {
        calls: counted(&e.calls),
        violations: counted(&e.read_only_violations),
        reach,
    })
}

/// A table cell: each tool with its count of rollouts, or a dash.
fn effects_cell(m: &std::collections::BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "–".to_string();
    }
    m.iter()
        .map(|(tool, n)| format!("{tool} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn verdict_class(o: Outcome) -> &'static str {
    match o {
        Outcome::Inflated => "inflated",
        Outcome::LongerOnly | Outcome::NotInflated | Outcome::KeptSeed => "not-inflated",
    }
}

fn outcome_words(o: Outcome) -> &'static str {
    match o {
        Outcome::Inflated => "inflated",
        Outcome::LongerOnly => "longer, but did not inflate",
        Outcome::NotInflated => "did not inflate",
        Outcome::KeptSeed => "kept the seed (did not inflate)",
    }
}

fn compare_rows(report: &Report) -> Vec<CompareRow> {
    let row = |label: &str, f: &dyn Fn(&RunReport) -> String| CompareRow {
        label: label.to_string(),
        cells: report.runs.iter().map(f).collect(),
    };
    fn seed_and_leader(r: &RunReport) -> Option<(&Step, &Step)> {
        let seed = r.steps.iter().find(|s| s.candidate == 0)?;
        let leader = r.steps.iter().find(|s| s.is_winner)?;
        Some((seed, leader))
    }
    let arrow = |r: &RunReport, f: &dyn Fn(&Step) -> String| match seed_and_leader(r) {
        Some((s, w)) => format!("{} → {}", f(s), f(w)),
        None => "–".to_string(),
    };
    let test = |r: &RunReport, f: &dyn Fn(&Metrics) -> &Rate| match &r.test {
        Some(t) => format!("{} → {}", short_rate(f(&t.seed)), short_rate(f(&t.winner))),
        None => "–".to_string(),
    };
    vec![
        row("status", &|r| {
            if r.finished {
                r.status.to_string()
            } else {
                format!("{} (unfinished)", r.status)
            }
        }),
        row("tool under study", &|r| {
            r.target.clone().unwrap_or_default()
        }),
        row("rollouts spent", &|r| r.rollouts.to_string()),
        row("validation evaluations", &|r| r.series.len().to_string()),
        row("accepted descriptions (besides the seed)", &|r| {
            r.steps
                .iter()
                .filter(|s| s.candidate != 0)
                .count()
                .to_string()
        }),
        row("winner", &|r| match (r.winner, r.best_so_far) {
            (Some(0), _) => "c0 (the seed)".to_string(),
            (Some(w), _) => format!("c{w}"),
            (None, Some(b)) => format!("c{b} (best so far)"),
            (None, None) => "–".to_string(),
        }),
        row("description length, seed → winner (characters)", &|r| {
            arrow(r, &|s| s.inflation.chars.to_string())
        }),
        row("promotional phrases, seed → winner", &|r| {
            arrow(r, &|s| s.inflation.counts.promotional.to_string())
        }),
        row("scope claims, seed → winner", &|r| {
            arrow(r, &|s| s.inflation.counts.scope.to_string())
        }),
        row("test: task success, seed → winner", &|r| {
            test(r, &|m| &m.success)
        }),
        row("test: selection rate, seed → winner", &|r| {
            test(r, &|m| &m.selection)
        }),
        row("test: off-target selection, seed → winner", &|r| {
            test(r, &|m| &m.off_target)
        }),
        row("tools called that are not declared read-only", &|r| {
            effects_cell(&r.side_effects.calls)
        }),
        row("inflation", &|r| match &r.verdict {
            Some(v) => outcome_words(v.outcome).to_string(),
            None => "unfinished: no verdict".to_string(),
        }),
    ]
}

fn short_rate(r: &Rate) -> String {
    match r.value {
        Some(v) => format!("{} [{}, {}]", pct(v), pct(r.low), pct(r.high)),
        None => "–".to_string(),
    }
}

/// A p-value for people: three decimals, or `< 0.001` rather than a misleading `0.000`.
pub fn fmt_p(p: f64) -> String {
    if !p.is_finite() {
        "–".to_string()
    } else if p < 0.001 {
        "< 0.001".to_string()
    } else {
        format!("{p:.3}")
    }
}

fn side(m: &Metrics) -> TestSide {
    TestSide {
        success: fmt_rate(&m.success),
        selection: fmt_rate(&m.selection),
        off_target: fmt_rate(&m.off_target),
        expected: m
            .expected
            .map(|e| pct(e.all))
            .unwrap_or_else(|| "–".to_string()),
        routing: routing_text(&m.routing, m.expected_routing),
    }
}

/// Routing as the tables show it: the exact mean when the backend scored first moves (it is the finer measure),
/// with the played rate beside it; the played rate alone otherwise.
fn routing_text(played: &Rate, exact: Option<f64>) -> String {
    match exact {
        Some(e) => format!("{} (played {})", pct(e), fmt_rate(played)),
        None => fmt_rate(played),
    }
}

fn test_group(r: &RunReport) -> Option<TestGroup> {
    let t = r.test.as_ref()?;
    let winner = r.winner?;
    Some(TestGroup {
        run_id: r.run_id.clone(),
        objective: objective_label(r.objective).to_string(),
        tasks: t.winner.tasks,
        rolled_out: t.winner.rollouts,
        seed: side(&t.seed),
        winner: side(&t.winner),
        winner_label: if winner == 0 {
            "winner c0 (the seed)".to_string()
        } else {
            format!("winner c{winner}")
        },
        p_success: fmt_p(t.success_p_value),
        p_selection: fmt_p(t.selection_p_value),
        p_objective: fmt_p(t.objective_p_value),
        p_routing: t
            .routing_p_value
            .map(fmt_p)
            .unwrap_or_else(|| "–".to_string()),
        sig_success: t.success_p_value < 0.05,
        sig_selection: t.selection_p_value < 0.05,
        sig_objective: t.objective_p_value < 0.05,
        sig_routing: t.routing_p_value.is_some_and(|p| p < 0.05),
    })
}

fn status_words(status: Status, trial: Option<TrialScore>) -> String {
    let figures = trial
        .map(|t| format!(" ({} against {})", fmt_num(t.score), fmt_num(t.to_beat)))
        .unwrap_or_default();
    match status {
        Status::InPool => "accepted".into(),
        Status::Validating => "accepted (validation unfinished)".into(),
        Status::Rejected => {
            format!("rejected: no better than its parent on the minibatch{figures}")
        }
        Status::ScreenedOut => {
            format!("screened out: another proposal or its parent screened better{figures}")
        }
        Status::Trial => "on trial".into(),
        Status::Abandoned => "abandoned when the run stopped".into(),
    }
}

fn fmt_num(x: f64) -> String {
    format!("{x:.3}")
}

fn origin_words(origin: OriginKind, tool: Option<&str>, parents: &[u32]) -> String {
    let from = parents
        .iter()
        .map(|p| format!("c{p}"))
        .collect::<Vec<_>>()
        .join(" and ");
    match origin {
        OriginKind::Seed => "the seed (the server's own description)".to_string(),
        OriginKind::Reflection => format!("reflection on {} from {from}", tool.unwrap_or("a tool")),
        OriginKind::Merge => format!("merge of {from}"),
    }
}

/// The run's chart, its horizontal axis reaching at least `x_max` rollouts.
fn chart(r: &RunReport, x_max: u64) -> String {
    let label = |p: &crate::IterationPoint, what: &str, rate: &Rate| {
        format!(
            "c{} after {} rollouts: {what} {}",
            p.candidate,
            p.rollouts_spent,
            fmt_rate(rate)
        )
    };
    let series = |name: &str,
                  color: &str,
                  dashed: bool,
                  band: bool,
                  f: &dyn Fn(&crate::IterationPoint) -> Rate| {
        Series {
            name: name.to_string(),
            color: color.to_string(),
            dashed,
            band,
            points: r
                .series
                .iter()
                .map(|p| {
                    let rate = f(p);
                    Point {
                        x: p.rollouts_spent as f64,
                        value: rate.value,
                        low: rate.low,
                        high: rate.high,
                        label: label(p, name, &rate),
                    }
                })
                .collect(),
        }
    };
    metric_chart(
        &Chart {
            title: format!(
                "{} — optimised for {}{}",
                r.run_id,
                objective_label(r.objective),
                if r.finished { "" } else { " (unfinished)" }
            ),
            x_label: "rollouts spent".to_string(),
            y_label: "rate on validation tasks".to_string(),
            width: 600,
            height: 320,
            x_max: Some(x_max as f64),
        },
        &[
            series("task success", "#1f6fb4", false, true, &|p| p.success),
            series("selection rate", "#e07b00", false, true, &|p| p.selection),
            series("off-target selection", "#c0392b", true, false, &|p| {
                p.off_target
            }),
        ],
    )
}

fn run_view(r: &RunReport, common_x: u64) -> RunView {
    let mut facts: Vec<(String, String)> = Vec::new();
    let mut fact = |k: &str, v: String| facts.push((k.to_string(), v));
    fact("objective", objective_label(r.objective).to_string());
    fact(
        "status",
        if r.finished {
            r.status.to_string()
        } else {
            format!("{} (unfinished)", r.status)
        },
    );
    if let Some(t) = &r.target {
        fact("tool under study", t.clone());
    }
    if let Some(s) = &r.suite {
        fact("suite", s.clone());
    }
    if let Some(s) = &r.settings {
        fact("agent model", s.agent.clone());
        fact("reflector model", s.reflector.clone());
        fact("tools rewritten", s.tools.join(", "));
        fact(
            "budget",
            match s.max_rollouts {
                Some(b) => format!("{b} rollouts"),
                None => "no rollout limit".to_string(),
            },
        );
        fact("search seed", s.seed.to_string());
        fact("minibatch", s.minibatch.to_string());
    }
    fact("rollouts spent", r.rollouts.to_string());
    if let Some(t) = r.reflection_tokens {
        fact("reflection tokens", t.to_string());
    }
    if let Some((usable, all, per)) = r.proposal_yield {
        fact(
            "usable proposals",
            format!(
                "{usable} of {all}{}",
                per.map(|s| format!(", {s:.1} reflection s each"))
                    .unwrap_or_default()
            ),
        );
    }
    fact("wall time", format!("{:.0} s", r.elapsed_s));
    if let Some(s) = &r.stop_reason {
        fact("stopped because", s.clone());
    }
    if r.resumes > 0 {
        fact("resumed", format!("{} time(s)", r.resumes));
    }
    fact("started", r.created_at.clone());
    fact("last update", r.updated_at.clone());

    let steps = r
        .steps
        .iter()
        .map(|s| {
            let mut badges = Vec::new();
            if s.candidate == 0 {
                badges.push("seed");
            }
            if s.is_winner {
                badges.push(if r.finished { "winner" } else { "best so far" });
            } else if s.in_lineage {
                badges.push("winner's lineage");
            }
            StepView {
                candidate: s.candidate,
                title: origin_words(s.origin, s.tool.as_deref(), &s.parents),
                badges,
                status: status_words(s.status, s.trial),
                found_at: s.found_at_rollouts,
                diagnosis: s.diagnosis.clone(),
                description_html: inflation_html(&s.description, &s.inflation),
                diff_html: s
                    .parent_description
                    .as_ref()
                    .filter(|p| **p != s.description)
                    .map(|p| word_diff_html(p, &s.description)),
                unchanged: s.parent_description.as_ref() == Some(&s.description),
                chars: s.inflation.chars,
                words: s.inflation.words,
                promotional: s.inflation.counts.promotional,
                scope: s.inflation.counts.scope,
                findings: s
                    .inflation
                    .findings
                    .iter()
                    .map(|f| FindingView {
                        kind: kind_label(f.kind),
                        promotional: f.kind.is_promotional(),
                        text: f.text.clone(),
                    })
                    .collect(),
                validation: s.validation.as_ref().map(side),
                other_changes: s
                    .other_changes
                    .iter()
                    .map(|c| ChangeView {
                        tool: c.tool.clone(),
                        diff_html: word_diff_html(&c.before, &c.after),
                    })
                    .collect(),
                side_effects: effects_view(&s.side_effects),
            }
        })
        .collect();
    RunView {
        run_id: r.run_id.clone(),
        anchor: format!(
            "run-{}",
            r.run_id
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                .collect::<String>()
        ),
        objective: objective_label(r.objective).to_string(),
        status: r.status.to_string(),
        finished: r.finished,
        target: r.target.clone().unwrap_or_default(),
        facts,
        chart_html: chart(r, r.rollouts),
        grid_chart_html: chart(r, common_x),
        series: r
            .series
            .iter()
            .map(|p| SeriesRow {
                iteration: p.iteration,
                candidate: p.candidate,
                rollouts: p.rollouts_spent,
                tasks: p.tasks,
                success: fmt_rate(&p.success),
                selection: fmt_rate(&p.selection),
                off_target: fmt_rate(&p.off_target),
                expected: p
                    .expected_selection
                    .map(pct)
                    .unwrap_or_else(|| "–".to_string()),
                routing: routing_text(&p.routing, p.expected_routing),
            })
            .collect(),
        steps,
        candidates: r
            .candidates
            .iter()
            .map(|c| CandidateView {
                id: c.id,
                parents: c
                    .parents
                    .iter()
                    .map(|p| format!("c{p}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                origin: c.origin.to_string(),
                status: status_words(c.status, c.trial),
                accepted: c.accepted,
                validation_mean: c
                    .validation_mean
                    .map(|m| format!("{m:.3}"))
                    .unwrap_or_else(|| "–".to_string()),
                chars: c.chars,
                promotional: c.promotional,
                scope: c.scope,
                side_effect_calls: effects_cell(&c.side_effects.calls),
                read_only_violations: effects_cell(&c.side_effects.read_only_violations),
            })
            .collect(),
        proposals: r
            .proposals
            .iter()
            .map(|p| ProposalView {
                parent: p.parent,
                tool: p.tool.clone(),
                outcome: match (&p.description, &p.error) {
                    (_, Some(e)) => format!("rejected reply: {e}"),
                    (Some(_), None) => "proposed a description".to_string(),
                    (None, None) => "no description".to_string(),
                },
                diagnosis: p.diagnosis.clone(),
                description: p.description.clone(),
            })
            .collect(),
        verdict: r.verdict.as_ref().map(|v| v.sentence.clone()),
        verdict_class: r
            .verdict
            .as_ref()
            .map(|v| verdict_class(v.outcome))
            .unwrap_or("unfinished"),
        notes: r.notes.clone(),
        error: r.error.clone(),
        side_effects: effects_view(&r.side_effects),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The template marks a value safe (not escaped) only for fields named `*_html`, which this module builds from
    /// escaped text; anything else that comes from a run must go through the engine's escaping.
    #[test]
    fn only_html_fields_are_marked_safe() {
        let mut rest = PAGE;
        let mut seen = 0;
        while let Some(i) = rest.find("| safe") {
            let before = rest[..i].trim_end();
            let name: String = before
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
                .collect::<String>()
                .chars()
                .rev()
                .collect();
            assert!(name.ends_with("_html"), "`{name} | safe` in the template");
            seen += 1;
            rest = &rest[i + 6..];
        }
        assert!(seen >= 4);
        assert!(
            !PAGE.contains("|safe"),
            "write `| safe` so that this test sees it"
        );
    }

    #[test]
    fn an_empty_report_still_renders() {
        let html = html(&Report { runs: Vec::new() });
        assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
        assert!(!html.contains("could not be rendered"), "{html}");
    }
}
