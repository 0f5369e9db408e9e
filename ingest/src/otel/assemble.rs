//! Cross-line assembly: a line's spans grouped by trace (built in the parallel parse when the line holds the root),
//! and the sequential [`Assembler`] that waits for each trace's root span across lines.

use super::build::build;
use super::span::{SpanRec, parse_line};
use crate::common::finish;
use crate::{Format, Parsed, RecordError};
use foldhash::{HashMap, HashMapExt, HashSet};
use rayon::prelude::*;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use tooltune_core::Trajectory;

/// How many finished trace ids are remembered to recognise spans that arrive after their trace was emitted.
const REMEMBERED_TRACES: usize = 100_000;

/// What one line holds, per trace: decoded in parallel with other lines, before the [`Assembler`] sees it.
pub(crate) struct LineOut<T> {
    line: u64,
    /// Where the line's text lies in its chunk, for when spans must wait for a later line.
    range: Range<usize>,
    result: Result<Vec<LineTrace<T>>, RecordError>,
}

impl<T> LineOut<T> {
    /// The record's errors (and those of the traces built from it alone) with its place in a document, an array
    /// or a page added.
    pub(crate) fn placed(mut self, place: crate::shape::Place) -> Self {
        match &mut self.result {
            Err(e) => *e = place.apply(std::mem::replace(e, RecordError::new(0, None, ""))),
            Ok(traces) => {
                for t in traces {
                    if let Some(Err(e)) = &mut t.built {
                        *e = place.apply(std::mem::replace(e, RecordError::new(0, None, "")));
                    }
                }
            }
        }
        self
    }
}

/// The spans of one trace in one line.
struct LineTrace<T> {
    trace_id: String,
    /// Where the trace's first root span is among the line's spans, if the line has one.
    root_at: Option<usize>,
    /// When the line holds the root, the trace built from this line's spans alone (and mapped): what the trace
    /// is unless an earlier line held some of its spans, which only the [`Assembler`] knows. Collectors batch
    /// whole traces, so this is nearly always the answer, and it was computed in parallel.
    built: Option<Result<T, RecordError>>,
}

/// Decodes one line and builds the traces whose root it holds (see [`LineTrace::built`]).
pub(crate) fn read_line<T>(
    text: Result<&str, RecordError>,
    line: u64,
    range: Range<usize>,
    map: &(impl Fn(Trajectory) -> T + Sync),
) -> LineOut<T> {
    let result = text.and_then(|text| parse_line(text, line)).map(|spans| {
        // Group by trace in order of first appearance; a line usually holds one trace, a batch many.
        let mut index: HashMap<Cow<'_, str>, usize> = HashMap::new();
        let mut groups: Vec<(Cow<'_, str>, Option<usize>, Vec<SpanRec<'_>>)> = Vec::new();
        for (n, s) in spans.into_iter().enumerate() {
            let tid = s.span.trace_id.text();
            let g = match index.get(&tid) {
                Some(&g) => g,
                None => {
                    index.insert(tid.clone(), groups.len());
                    groups.push((tid, None, Vec::new()));
                    groups.len() - 1
                }
            };
            let group = &mut groups[g];
            if group.1.is_none() && s.is_root() {
                group.1 = Some(n);
            }
            group.2.push(s);
        }
        groups
            .into_iter()
            .map(|(tid, root_at, spans)| {
                let built = root_at.map(|_| {
                    build(&tid, spans, true, line)
                        .and_then(|t| finish(Format::Otel, t, line))
                        .map(map)
                });
                LineTrace {
                    trace_id: tid.into_owned(),
                    root_at,
                    built,
                }
            })
            .collect()
    });
    LineOut {
        line,
        range,
        result,
    }
}

/// A line that holds spans of a trace still waiting for its root: its text, shared by the traces it holds.
#[derive(Clone)]
struct Piece {
    line: u64,
    text: Arc<str>,
}

struct Pending {
    first_line: u64,
    seq: u64,
    pieces: Vec<Piece>,
}

enum Slot<T> {
    Ready(Parsed<T>),
    Build {
        line: u64,
        trace_id: String,
        pieces: Vec<Piece>,
        complete: bool,
    },
}

/// Groups spans by trace across lines and emits each trace once its root span has arrived.
///
/// A trace whose spans all came in the line of its root was built in parallel with the line's decoding and passes
/// through. A trace spread over lines keeps the text of each of its lines until the root arrives, and is built
/// again from those lines then; memory holds those lines, for traces still waiting for their root.
#[derive(Default)]
pub(crate) struct Assembler {
    pending: HashMap<String, Pending>,
    seq: u64,
    done: HashSet<String>,
    done_order: VecDeque<String>,
}

impl Assembler {
    fn remember(&mut self, trace_id: String) {
        if self.done_order.len() >= REMEMBERED_TRACES
            && let Some(old) = self.done_order.pop_front()
        {
            self.done.remove(&old);
        }
        self.done.insert(trace_id.clone());
        self.done_order.push_back(trace_id);
    }

    /// How many traces are waiting for their root span.
    pub(crate) fn pending_traces(&self) -> usize {
        self.pending.len()
    }

    /// Takes one chunk's decoded lines in file order (`data` is the chunk's text, which their ranges point into);
    /// at EOF also flushes traces that never got a root.
    pub(crate) fn process<T: Send>(
        &mut self,
        lines: Vec<LineOut<T>>,
        data: &[u8],
        at_eof: bool,
        map: &(impl Fn(Trajectory) -> T + Sync),
    ) -> Vec<Parsed<T>> {
        let mut slots: Vec<Slot<T>> = Vec::new();
        for out in lines {
            let line = out.line;
            let traces = match out.result {
                Ok(traces) => traces,
                Err(e) => {
                    slots.push(Slot::Ready(Parsed {
                        line,
                        result: Err(e),
                    }));
                    continue;
                }
            };
            // The line's text, copied once if some trace of it has to wait.
            let mut piece: Option<Piece> = None;
            let mut piece_of = || -> Piece {
                piece
                    .get_or_insert_with(|| Piece {
                        line,
                        text: Arc::from(String::from_utf8_lossy(&data[out.range.clone()])),
                    })
                    .clone()
            };
            let mut late: Vec<String> = Vec::new();
            let mut completed: Vec<(usize, Slot<T>)> = Vec::new();
            for t in traces {
                if self.done.contains(&t.trace_id) {
                    late.push(t.trace_id);
                    continue;
                }
                if let Some(p) = self.pending.get_mut(&t.trace_id) {
                    p.pieces.push(piece_of());
                    if let Some(root_at) = t.root_at
                        && let Some(p) = self.pending.remove(&t.trace_id)
                    {
                        self.remember(t.trace_id.clone());
                        completed.push((
                            root_at,
                            Slot::Build {
                                line,
                                trace_id: t.trace_id,
                                pieces: p.pieces,
                                complete: true,
                            },
                        ));
                    }
                    continue;
                }
                match (t.root_at, t.built) {
                    (Some(root_at), Some(result)) => {
                        self.remember(t.trace_id);
                        completed.push((root_at, Slot::Ready(Parsed { line, result })));
                    }
                    _ => {
                        self.seq += 1;
                        let pending = Pending {
                            first_line: line,
                            seq: self.seq,
                            pieces: vec![piece_of()],
                        };
                        self.pending.insert(t.trace_id, pending);
                    }
                }
            }
            for tid in late {
                slots.push(Slot::Ready(Parsed {
                    line,
                    result: Err(RecordError::new(
                        line,
                        None,
                        format!(
                            "spans of trace {tid} arrived after its root span completed the trace; they are ignored"
                        ),
                    )),
                }));
            }
            // Traces complete in the order their roots came.
            completed.sort_by_key(|&(root_at, _)| root_at);
            slots.extend(completed.into_iter().map(|(_, slot)| slot));
        }
        if at_eof {
            let mut rest: Vec<(String, Pending)> = self.pending.drain().collect();
            rest.sort_by_key(|(_, p)| p.seq);
            for (tid, p) in rest {
                slots.push(Slot::Build {
                    line: p.first_line,
                    trace_id: tid,
                    pieces: p.pieces,
                    complete: false,
                });
            }
        }
        slots
            .into_par_iter()
            .map(|slot| match slot {
                Slot::Ready(p) => p,
                Slot::Build {
                    line,
                    trace_id,
                    pieces,
                    complete,
                } => Parsed {
                    line,
                    result: rebuild(&trace_id, &pieces, complete, line)
                        .and_then(|t| finish(Format::Otel, t, line))
                        .map(map),
                },
            })
            .collect()
    }
}

/// Builds a trace from the lines that hold its spans, decoding them again.
fn rebuild(
    trace_id: &str,
    pieces: &[Piece],
    complete: bool,
    line: u64,
) -> Result<Trajectory, RecordError> {
    let mut spans = Vec::new();
    for p in pieces {
        spans.extend(
            parse_line(&p.text, p.line)?
                .into_iter()
                .filter(|s| s.span.trace_id.is(trace_id)),
        );
    }
    build(trace_id, spans, complete, line)
}
