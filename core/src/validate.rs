//! [`Trajectory::validate`], the one validation step every producer goes through, and its [`ValidationError`].

use crate::{Step, ToolSpec, Trajectory};

/// Why a trajectory is not acceptable, with the JSON path of the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ValidationError {
    /// JSON path into the trajectory, e.g. `steps[3].tool_calls[0].name`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl ValidationError {
    fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        ValidationError {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl Trajectory {
    /// Checks the invariants every stored trajectory keeps: a task, unique tool names, a score in [0, 1],
    /// every tool call naming a tool that was in the tool list (otherwise "selection" is meaningless), and hints
    /// only for tools in it.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.task.trim().is_empty() {
            return Err(ValidationError::new("task", "is empty"));
        }
        // foldhash: std's SipHash is made to resist chosen keys, which costs on every record and buys nothing for
        // a set that lives for one call.
        let mut seen = foldhash::HashSet::default();
        for (i, t) in self.tools.iter().enumerate() {
            if t.name.is_empty() {
                return Err(ValidationError::new(format!("tools[{i}].name"), "is empty"));
            }
            if !seen.insert(t.name.as_str()) {
                return Err(ValidationError::new(
                    format!("tools[{i}].name"),
                    format!("tool `{}` is listed twice", t.name),
                ));
            }
        }
        for name in self.tool_annotations.keys() {
            if !seen.contains(name.as_str()) {
                return Err(ValidationError::new(
                    format!("tool_annotations.{name}"),
                    format!(
                        "hints for tool `{name}`, which is not in the tool list ({})",
                        list_names(&self.tools)
                    ),
                ));
            }
        }
        if let Some(s) = self.outcome.score
            && !(0.0..=1.0).contains(&s)
        {
            return Err(ValidationError::new(
                "outcome.score",
                format!("{s} is outside [0, 1]"),
            ));
        }
        for (i, step) in self.steps.iter().enumerate() {
            match step {
                Step::Model { tool_calls, .. } => {
                    for (j, c) in tool_calls.iter().enumerate() {
                        if !seen.contains(c.name.as_str()) {
                            return Err(ValidationError::new(
                                format!("steps[{i}].tool_calls[{j}].name"),
                                format!(
                                    "calls tool `{}`, which is not in the tool list ({})",
                                    c.name,
                                    list_names(&self.tools)
                                ),
                            ));
                        }
                    }
                }
                Step::ToolResult { name, .. } => {
                    if !seen.contains(name.as_str()) {
                        return Err(ValidationError::new(
                            format!("steps[{i}].name"),
                            format!(
                                "result of tool `{name}`, which is not in the tool list ({})",
                                list_names(&self.tools)
                            ),
                        ));
                    }
                }
                Step::User { .. } => {}
            }
        }
        Ok(())
    }
}

fn list_names(tools: &[ToolSpec]) -> String {
    if tools.is_empty() {
        return "the list is empty".to_string();
    }
    tools
        .iter()
        .map(|t| t.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
