//! The `tooltune` format: one `Trajectory` per line in exactly tooltune-core's serde shape (unknown fields denied).

use crate::common::{finish, from_json};
use crate::{Format, RecordError};
use tooltune_core::Trajectory;

/// Parses and validates one tooltune record.
pub(crate) fn parse(text: &str, line: u64) -> Result<Trajectory, RecordError> {
    let t: Trajectory = from_json(text, line)?;
    finish(Format::Tooltune, t, line)
}
