//! Writes a session's events into the trace store from a task of its own, in batches, so that forwarding never
//! waits on the database. The forwarding path only puts an event into a bounded queue; when the queue is full
//! (the store stalled for a long time) the event is counted as dropped, and the count is stored with the
//! session, so a gap in the record is visible rather than silent.

use crate::session::{Call, Event};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tooltune_store::{NewProxySession, ProxyCall, SessionFacts, Store};

/// Events waiting to be written, at most.
const QUEUE: usize = 16_384;
/// Calls written in one transaction, at most.
const BATCH: usize = 256;
/// How long a call may wait for others to share its transaction.
const LINGER: Duration = Duration::from_millis(200);

/// The forwarding path's handle on the recorder.
#[derive(Debug, Clone)]
pub struct Recorder {
    tx: mpsc::Sender<Event>,
    dropped: Arc<AtomicU64>,
}

/// The writer task; [`Writer::finish`] waits for every queued event to be stored.
#[derive(Debug)]
pub struct Writer {
    handle: JoinHandle<()>,
    dropped: Arc<AtomicU64>,
    store: Store,
    session: String,
}

impl Recorder {
    /// Opens the session in the store and starts its writer.
    pub async fn start(
        store: Store,
        session: NewProxySession,
    ) -> Result<(Recorder, Writer), tooltune_store::StoreError> {
        store.start_proxy_session(&session).await?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let handle = tokio::spawn(write_loop(store.clone(), session.id.clone(), rx));
        Ok((
            Recorder {
                tx,
                dropped: dropped.clone(),
            },
            Writer {
                handle,
                dropped,
                store,
                session: session.id,
            },
        ))
    }

    /// Queues an event without waiting.
    pub fn record(&self, event: Event) {
        if self.tx.try_send(event).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Writer {
    /// Waits until everything queued is stored (every [`Recorder`] must have been dropped), then closes the
    /// session with the number of events dropped.
    pub async fn finish(self) -> Result<u64, tooltune_store::StoreError> {
        if let Err(e) = self.handle.await {
            tracing::error!(session = %self.session, "the recorder stopped: {e}");
        }
        let dropped = self.dropped.load(Ordering::Relaxed);
        self.store.end_proxy_session(&self.session, dropped).await?;
        Ok(dropped)
    }
}

fn to_row(session: &str, c: Box<Call>) -> ProxyCall {
    let c = *c;
    ProxyCall {
        session_id: session.to_string(),
        seq: c.seq,
        tool: c.tool,
        description_id: c.description_id.map(|d| d.as_str().to_string()),
        arguments: c.arguments.map(|a| a.to_string()),
        is_error: c.is_error,
        rpc_error: c.rpc_error.map(|e| e.to_string()),
        latency_ms: c.latency.as_secs_f64() * 1000.0,
        result: c.result.map(|r| r.to_string()),
        called_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    }
}

async fn write_loop(store: Store, session: String, mut rx: mpsc::Receiver<Event>) {
    let mut calls: Vec<ProxyCall> = Vec::new();
    let mut facts = SessionFacts::default();
    loop {
        let first = rx.recv().await;
        let closed = first.is_none();
        let mut take = |e: Event, calls: &mut Vec<ProxyCall>| match e {
            Event::Call(c) => calls.push(to_row(&session, c)),
            Event::Client(c) => facts.client = Some(c.to_string()),
            Event::ProtocolVersion(p) => facts.protocol_version = Some(p),
            Event::Tools(t) => {
                let map: serde_json::Map<String, Value> = t
                    .into_iter()
                    .map(|(name, shown)| {
                        let mut tool = json!({
                            "description": shown.description,
                            "description_id": shown.id.as_str(),
                        });
                        // The hints in the store's own spelling (as in a trajectory's `tool_annotations`).
                        if !shown.annotations.is_empty() {
                            tool["annotations"] =
                                serde_json::to_value(shown.annotations).unwrap_or_default();
                        }
                        (name, tool)
                    })
                    .collect();
                facts.tools = Some(Value::Object(map).to_string());
            }
            Event::MissingTools(_) => {}
        };
        if let Some(e) = first {
            take(e, &mut calls);
            // Gather what arrives shortly after, so a busy session writes one transaction, not one per call.
            let deadline = tokio::time::Instant::now() + LINGER;
            while calls.len() < BATCH {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(e)) => take(e, &mut calls),
                    _ => break,
                }
            }
        }
        if facts != SessionFacts::default() {
            match store.update_proxy_session(&session, &facts).await {
                Ok(()) => facts = SessionFacts::default(),
                Err(e) => {
                    tracing::warn!(%session, "recording the session's facts: {e}; will retry")
                }
            }
        }
        if !calls.is_empty() {
            // A failed write keeps the calls for the next round (rows are keyed by session and seq, so a batch
            // that did land and is written again is stored once).
            match store.record_proxy_calls(&calls).await {
                Ok(()) => calls.clear(),
                Err(e) => {
                    tracing::warn!(%session, calls = calls.len(), "recording calls: {e}; will retry");
                    if closed {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        }
        if closed {
            if calls.is_empty() && facts == SessionFacts::default() {
                return;
            }
            // One more attempt for what the last round could not write, then give up loudly.
            let r1 = store.update_proxy_session(&session, &facts).await;
            let r2 = store.record_proxy_calls(&calls).await;
            if let Err(e) = r1.and(r2) {
                tracing::error!(%session, calls = calls.len(), "could not record: {e}");
            }
            return;
        }
    }
}
