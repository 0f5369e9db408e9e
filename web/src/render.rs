//! The pieces of HTML that the report crate draws (score charts, word diffs, inflation highlights), fed from the
//! service's views. Keeping the drawing in `tooltune-report` means the dashboard and the report file show the same
//! thing the same way; this module only chooses what goes in.

use crate::view::EvalPoint;
use serde_json::Value;
use tooltune_objectives::stats::Rate;
use tooltune_objectives::{InflationReport, inflation};
use tooltune_report::svg::{Chart, Point, Series, metric_chart};

fn point(x: u64, r: &Rate, label: String) -> Point {
    Point {
        x: x as f64,
        value: r.value,
        low: r.low,
        high: r.high,
        label,
    }
}

/// One chart of a metric over the run: every full (validation) evaluation, and the best value so far.
fn metric_over_run(
    title: &str,
    evals: &[&EvalPoint],
    budget: Option<u64>,
    pick: fn(&EvalPoint) -> &Rate,
) -> String {
    let mut evaluated = Vec::new();
    let mut best = Vec::new();
    let mut best_so_far: Option<&EvalPoint> = None;
    for e in evals {
        let r = pick(e);
        evaluated.push(point(
            e.rollouts_spent,
            r,
            format!("c{} after {} rollouts", e.candidate, e.rollouts_spent),
        ));
        if r.value.is_some()
            && best_so_far.is_none_or(|b| pick(b).value.unwrap_or(-1.0) < r.value.unwrap_or(-1.0))
        {
            best_so_far = Some(e);
        }
        if let Some(b) = best_so_far {
            best.push(point(
                e.rollouts_spent,
                pick(b),
                format!("best so far: c{}", b.candidate),
            ));
        }
    }
    metric_chart(
        &Chart {
            title: title.to_string(),
            x_label: "rollouts spent".into(),
            y_label: "validation".into(),
            width: 520,
            height: 260,
            // The whole budget on the axis, so that a live run's chart shows how far along it is.
            x_max: budget.map(|b| b as f64),
        },
        &[
            Series {
                name: "candidate evaluated".into(),
                color: "#1f77b4".into(),
                dashed: false,
                band: false,
                points: evaluated,
            },
            Series {
                name: "best so far".into(),
                color: "#2ca02c".into(),
                dashed: true,
                band: true,
                points: best,
            },
        ],
    )
}

/// The two score charts of a run (task success and selection rate of the target), from its validation
/// evaluations. Both are drawn whichever objective the run optimises: that is how inflation shows.
pub(crate) fn score_charts(
    evals: &[EvalPoint],
    target: &str,
    budget: Option<u64>,
) -> (String, String) {
    let full: Vec<&EvalPoint> = evals
        .iter()
        .filter(|e| e.phase == tooltune_run::Phase::VALIDATION)
        .collect();
    (
        metric_over_run("Task success", &full, budget, |e| &e.success),
        metric_over_run(
            &format!("Selection rate of `{target}`"),
            &full,
            budget,
            |e| &e.selection,
        ),
    )
}

/// `new` against `old`, word by word, as escaped HTML with `<del>` and `<ins>`.
pub(crate) fn diff(old: &str, new: &str) -> String {
    tooltune_report::diff::word_diff_html(old, new)
}

/// A description measured for inflation and drawn with its findings marked.
pub(crate) fn highlighted(text: &str, tool: &str, schema: &Value) -> (String, InflationReport) {
    let report = inflation::measure_text(text, tool, schema);
    (
        tooltune_report::highlight::inflation_html(text, &report),
        report,
    )
}
