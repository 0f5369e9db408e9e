//! The `langfuse` format: one trace object per line as Langfuse's public API returns it
//! (`GET /api/public/traces/{id}`), with `observations` (a flat list) and `scores` embedded.
//!
//! GENERATION observations are model turns (their input holds the OpenAI-style request the SDK integrations log,
//! their output the assistant message); TOOL observations, and SPANs named after a listed tool, are tool results.

use crate::common::{finish, from_json};
use crate::{Format, RecordError};
use convert::convert;
use lean::strict;
use schema::Trace;
use tooltune_core::Trajectory;

// The first pass allocates little: strings borrow from the line when they hold no escapes ([`Text`]), and of the
// free-form values (outputs, metadata, usage) only what `convert` reads is built. Building them all as `Value`s
// (an ordered map and a `String` per key) and `String`s was most of the first pass's cost, and most of them
// (metadata, usage totals and units, AGENT outputs) are never read.

/// The scalar visitor methods of a visitor that takes any scalar as `$v` (and, with `str`, any string too): the
/// visitors of the submodules read only some shapes of a free-form value and treat the others as absent. Defined
/// before the `mod` lines: a `macro_rules!` is in scope only after its definition.
macro_rules! scalars_give {
    ($v:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($v)
        }
    };
    ($v:expr, str) => {
        scalars_give!($v);
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok($v)
        }
    };
}

mod convert;
mod fast;
mod inputs;
mod lean;
mod outcome;
mod schema;
#[cfg(test)]
mod tests;

/// Parses and validates one Langfuse trace.
pub(crate) fn parse(text: &str, line: u64) -> Result<Trajectory, RecordError> {
    // Three passes, each only for what the one before gave up on: the scanner (fast.rs), the lean serde pass, and
    // the full decode with the declared types and path tracking, which names an error exactly as it always has.
    // Each pass fails on every record the next one fails on (and, conservatively, on a few odd ones it cannot
    // judge), so a record reads the same whichever pass reads it.
    let trace: Trace = match fast::trace(text) {
        Ok(trace) => trace,
        Err(_) => match serde_json::from_str(text) {
            Ok(trace) => trace,
            Err(_) => strict(|| from_json(text, line))?,
        },
    };
    let t = convert(trace, line)?;
    finish(Format::Langfuse, t, line)
}
