//! Builds one `[[task]]` of a suite file into a [`Task`]: its answer check, fixture checks and tool lists are
//! validated here, so that a task that could never pass, or checks nothing, is refused when the suite loads.

use super::{Ctx, OneOrMany, RawAnswer, RawTask, build_command};
use crate::EvalError;
use crate::suite::{AnswerCheck, CommandCheck, Task};
use regex::RegexBuilder;
use std::path::Path;

pub(super) fn build_task(
    i: usize,
    t: RawTask,
    suite_max: u32,
    dir: &Path,
    fixture: bool,
    catalog: bool,
    ctx: &Ctx,
) -> Result<Task, EvalError> {
    let e = |field: &str, msg: String| ctx.err(Some(i), field, msg);
    if catalog {
        // A catalog suite has nothing to roll out on: a check would never run, and silently ignoring one would let
        // a user believe it did.
        for (field, set) in [
            ("answer", t.answer.is_some()),
            ("expect_tools", !t.expect_tools.is_empty()),
            ("forbid_tools", !t.forbid_tools.is_empty()),
            ("reference", !t.reference.is_empty()),
            ("expect_file", !t.expect_file.is_empty()),
            ("expect_command", t.expect_command.is_some()),
        ] {
            if set {
                return Err(e(
                    field,
                    "a catalog suite's tasks are scored by their first move only (no server runs a rollout): \
                     give `owner`, or no owner for a request that needs no tool, and no check"
                        .into(),
                ));
            }
        }
    }
    if t.id.trim().is_empty() {
        return Err(e("id", "is empty".into()));
    }
    if t.id.chars().any(char::is_whitespace) {
        return Err(e("id", format!("{:?} contains whitespace", t.id)));
    }
    if t.prompt.trim().is_empty() {
        return Err(e("prompt", "is empty".into()));
    }
    let max_steps = t.max_steps.unwrap_or(suite_max);
    if max_steps == 0 {
        return Err(e("max_steps", "must be at least 1".into()));
    }
    let answer = match t.answer {
        None => None,
        Some(a) => Some(build_answer(a, &e)?),
    };
    if !fixture && (!t.expect_file.is_empty() || t.expect_command.is_some()) {
        let field = if t.expect_file.is_empty() {
            "expect_command"
        } else {
            "expect_file"
        };
        return Err(e(
            field,
            "checks the fixture after the rollout, but the suite has no [fixture]".into(),
        ));
    }
    for (j, f) in t.expect_file.iter().enumerate() {
        let p = Path::new(&f.path);
        if f.path.trim().is_empty()
            || p.is_absolute()
            || p.components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(e(
                &format!("expect_file[{j}].path"),
                format!(
                    "{:?} must be a path inside the fixture (relative, without `..`)",
                    f.path
                ),
            ));
        }
        if !f.exists && (!f.contains.is_empty() || !f.lacks.is_empty() || f.equals.is_some()) {
            return Err(e(
                &format!("expect_file[{j}]"),
                "`exists = false` cannot be combined with content checks".into(),
            ));
        }
    }
    let expect_command = match &t.expect_command {
        None => None,
        Some(c) => {
            let (command, args, timeout) = build_command(c, dir, "expect_command", 30.0, ctx)
                .map_err(|err| match err {
                    EvalError::Suite {
                        file,
                        line,
                        field,
                        message,
                        ..
                    } => EvalError::Suite {
                        file,
                        line,
                        task: Some(ctx.task_label(i)),
                        field,
                        message,
                    },
                    other => other,
                })?;
            if c.cwd.is_some() {
                return Err(e(
                    "expect_command.cwd",
                    "is always the rollout's copy of the fixture".into(),
                ));
            }
            Some(CommandCheck {
                command,
                args,
                timeout,
            })
        }
    };
    if !catalog
        && answer.is_none()
        && t.expect_tools.is_empty()
        && t.forbid_tools.is_empty()
        && t.expect_file.is_empty()
        && expect_command.is_none()
    {
        return Err(e(
            "answer",
            "the task has no check: give `answer.*`, `expect_tools`, `forbid_tools`, `expect_file` or \
             `expect_command`"
                .into(),
        ));
    }
    for n in &t.expect_tools {
        if t.forbid_tools.contains(n) {
            return Err(e(
                "forbid_tools",
                format!("tool `{n}` is both expected and forbidden"),
            ));
        }
    }
    if let Some(o) = &t.owner
        && t.forbid_tools.contains(o)
    {
        return Err(e(
            "owner",
            format!("the owner `{o}` is also in forbid_tools"),
        ));
    }
    for (j, r) in t.reference.iter().enumerate() {
        if !r.arguments.is_object() {
            return Err(e(
                &format!("reference[{j}].arguments"),
                "must be a table".into(),
            ));
        }
    }
    Ok(Task {
        id: t.id,
        prompt: t.prompt,
        split: t.split,
        owner: t.owner,
        answer,
        expect_tools: t.expect_tools,
        expect_order: t.expect_order.unwrap_or(true),
        forbid_tools: t.forbid_tools,
        max_steps,
        reference: t.reference,
        expect_files: t.expect_file,
        expect_command,
        provenance: t.provenance,
    })
}

fn build_answer(
    a: RawAnswer,
    e: &impl Fn(&str, String) -> EvalError,
) -> Result<AnswerCheck, EvalError> {
    let ignore_case = a.ignore_case.unwrap_or(true);
    let regex = match &a.regex {
        None => None,
        Some(r) => Some(
            RegexBuilder::new(r)
                .case_insensitive(ignore_case)
                .build()
                .map_err(|err| e("answer.regex", format!("does not compile: {err}")))?,
        ),
    };
    if let Some(n) = a.number
        && !n.is_finite()
    {
        return Err(e("answer.number", format!("{n} is not a finite number")));
    }
    let tolerance = a.tolerance.unwrap_or(0.0);
    if !(tolerance.is_finite() && tolerance >= 0.0) {
        return Err(e(
            "answer.tolerance",
            format!("{tolerance} is not a non-negative number"),
        ));
    }
    if a.tolerance.is_some() && a.number.is_none() {
        return Err(e(
            "answer.tolerance",
            "applies to `answer.number`, which is not set".into(),
        ));
    }
    let contains = match a.contains {
        None => Vec::new(),
        Some(OneOrMany::One(s)) => vec![s],
        Some(OneOrMany::Many(v)) => v,
    };
    if contains.iter().any(|s| s.is_empty()) {
        return Err(e("answer.contains", "holds an empty string".into()));
    }
    if let Some(x) = &a.exact
        && x.trim().is_empty()
    {
        return Err(e("answer.exact", "is empty".into()));
    }
    let check = AnswerCheck {
        exact: a.exact,
        regex,
        number: a.number,
        tolerance,
        contains,
        ignore_case,
    };
    if check.is_empty() {
        return Err(e(
            "answer",
            "sets no check: give exact, regex, number or contains".into(),
        ));
    }
    Ok(check)
}
