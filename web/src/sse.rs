//! `GET /api/runs/{id}/events`: a run's progress as server-sent events.
//!
//! The events come from the store, not from memory, so a stream works the same for a run this server drives, a
//! run the CLI drives in another process, a finished run (it replays and ends) and after a reconnect
//! (`Last-Event-ID` or `?after=` resumes after that sequence number). A job of this server wakes the stream when it
//! reports progress; otherwise the stream looks again every second. When the run is over the stream sends an
//! `end` event with the final status and closes.

use crate::{AppState, WebError};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use serde::Deserialize;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::watch;

/// Query of the events endpoint.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventsQuery {
    /// Only events with a larger sequence number (default: all).
    #[serde(default)]
    after: Option<i64>,
}

/// How long a stream waits for a wake-up before looking at the store anyway.
const POLL: Duration = Duration::from_secs(1);
/// After a wake-up that found nothing new, look again soon: the driver reports an event just before storing it.
const RECHECK: Duration = Duration::from_millis(100);

struct Cursor {
    state: AppState,
    id: String,
    after: i64,
    ticks: Option<watch::Receiver<u64>>,
    shutdown: watch::Receiver<bool>,
    pending: VecDeque<SseEvent>,
    wait: Duration,
    done: bool,
}

impl Cursor {
    /// Moves new stored events into `pending`. Returns whether there were any.
    async fn fetch(&mut self) -> Result<bool, WebError> {
        let events = self.state.store.events(&self.id, self.after).await?;
        let any = !events.is_empty();
        for (seq, text) in events {
            self.after = seq;
            self.pending.push_back(
                SseEvent::default()
                    .id(seq.to_string())
                    .event("progress")
                    .data(text),
            );
        }
        Ok(any)
    }

    /// The next event, or `None` when the stream is over.
    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Some(e);
            }
            if self.done || *self.shutdown.borrow() {
                return None;
            }
            match self.step().await {
                Ok(()) => {}
                Err(e) => {
                    e.log();
                    self.done = true;
                    self.pending.push_back(
                        SseEvent::default()
                            .event("stream-error")
                            .data(serde_json::json!({ "error": e.public_message() }).to_string()),
                    );
                }
            }
        }
    }

    async fn step(&mut self) -> Result<(), WebError> {
        if self.fetch().await? {
            self.wait = POLL;
            return Ok(());
        }
        let row = self
            .state
            .store
            .run(&self.id)
            .await?
            .ok_or_else(|| WebError::NotFound(format!("run `{}`", self.id)))?;
        let ours = self.state.jobs.state(&self.id).is_some();
        if row.status.is_terminal() && !ours {
            // The driver stores its last event before the final status: one more look catches it.
            self.fetch().await?;
            self.pending.push_back(
                SseEvent::default().event("end").data(
                    serde_json::json!({ "status": row.status, "error": row.error }).to_string(),
                ),
            );
            self.done = true;
            return Ok(());
        }
        if self.ticks.is_none() {
            self.ticks = self.state.jobs.subscribe(&self.id);
        }
        let wait = self.wait;
        let woke = match &mut self.ticks {
            Some(rx) => tokio::select! {
                r = rx.changed() => {
                    if r.is_err() {
                        // The job ended; the next look at the store sees its final status.
                        self.ticks = None;
                    }
                    true
                }
                _ = tokio::time::sleep(wait) => false,
                _ = self.shutdown.changed() => false,
            },
            None => tokio::select! {
                _ = tokio::time::sleep(wait) => false,
                _ = self.shutdown.changed() => false,
            },
        };
        self.wait = if woke { RECHECK } else { POLL };
        if self.shutdown.has_changed().is_err() {
            // The server was dropped without a shutdown: nothing will ever wake this stream properly again.
            self.done = true;
        }
        Ok(())
    }
}

/// The handler.
pub(crate) async fn events(
    State(state): State<AppState>,
    Path(id): Path<String>,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, WebError> {
    let Query(q) = query.map_err(|e| WebError::BadRequest(e.body_text()))?;
    if state.store.run(&id).await?.is_none() {
        return Err(WebError::NotFound(format!("run `{id}`")));
    }
    let last_seen = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok());
    let after = last_seen.or(q.after).unwrap_or(-1);
    let cursor = Cursor {
        ticks: state.jobs.subscribe(&id),
        shutdown: state.shutdown.clone(),
        state,
        id,
        after,
        pending: VecDeque::new(),
        wait: POLL,
        done: false,
    };
    let stream = futures::stream::unfold(cursor, |mut c| async move {
        let e = c.next().await?;
        Some((Ok(e), c))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
