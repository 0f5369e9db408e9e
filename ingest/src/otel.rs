//! The `otel` format: OTLP/JSON trace requests, one `{"resourceSpans": [...]}` per line as the OpenTelemetry
//! collector's file exporter writes them, with spans following the GenAI semantic conventions.
//!
//! Spans of one trace may arrive on several lines. Lines are decoded in parallel; the [`Assembler`] then groups
//! spans by `traceId` sequentially and hands a trace over for (parallel) assembly as soon as its root span (no
//! `parentSpanId`) arrives. Exporters send a span when it ends and a root ends after its children, so the root is
//! normally the last span of its trace; memory holds only traces still waiting for their root.

mod assemble;
mod build;
mod fast;
mod history;
mod messages;
mod schema;
mod span;
#[cfg(test)]
mod tests;

pub(crate) use assemble::{Assembler, LineOut, read_line};

/// Our outcome attributes, set on the root span by whoever judged the run.
pub const OUTCOME_SCORE: &str = "tooltune.outcome.score";
/// See [`OUTCOME_SCORE`].
pub const OUTCOME_SUCCESS: &str = "tooltune.outcome.success";
/// See [`OUTCOME_SCORE`].
pub const OUTCOME_FEEDBACK: &str = "tooltune.outcome.feedback";
