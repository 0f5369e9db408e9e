//! Several reflections decoded as one batch: a [`ChatModel`] wrapper that holds each caller's request until every
//! live caller has asked, then sends them all through one `chat_many`.
//!
//! Why: k proposals of one reflection are k conversations with the same prompt. Asked one by one, the local
//! model decodes them one after another; asked together, it decodes them as parallel sequences of one batch,
//! which on two cores costs little more than one.

use async_trait::async_trait;
use std::sync::Mutex;
use tokio::sync::oneshot;
use tooltune_core::Usage;
use tooltune_llm::{ChatModel, ChatRequest, ChatResponse, LlmError};

type Reply = oneshot::Sender<Result<ChatResponse, LlmError>>;

/// The batching wrapper. Each of `live` callers must call [`Gather::leave`] when it will ask nothing more.
pub(crate) struct Gather<'a> {
    inner: &'a dyn ChatModel,
    state: Mutex<State>,
}

struct State {
    live: usize,
    pending: Vec<(ChatRequest, Reply)>,
}

impl<'a> Gather<'a> {
    pub(crate) fn new(inner: &'a dyn ChatModel, callers: usize) -> Self {
        Gather {
            inner,
            state: Mutex::new(State {
                live: callers,
                pending: Vec::new(),
            }),
        }
    }

    /// The pending requests, if every live caller is waiting on one.
    fn take_if_complete(&self) -> Vec<(ChatRequest, Reply)> {
        let mut s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if s.live > 0 && s.pending.len() >= s.live {
            std::mem::take(&mut s.pending)
        } else {
            Vec::new()
        }
    }

    async fn flush(&self, batch: Vec<(ChatRequest, Reply)>) {
        if batch.is_empty() {
            return;
        }
        let (reqs, replies): (Vec<ChatRequest>, Vec<Reply>) = batch.into_iter().unzip();
        let out = self.inner.chat_many(&reqs).await;
        for (reply, r) in replies.into_iter().zip(out) {
            // A caller that gave up has nobody to tell.
            let _ = reply.send(r);
        }
    }

    /// One caller is done: the others no longer wait for it.
    pub(crate) async fn leave(&self) {
        {
            let mut s = self
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            s.live = s.live.saturating_sub(1);
        }
        self.flush(self.take_if_complete()).await;
    }
}

#[async_trait]
impl ChatModel for Gather<'_> {
    fn id(&self) -> String {
        self.inner.id()
    }

    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let (tx, rx) = oneshot::channel();
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pending
            .push((req.clone(), tx));
        self.flush(self.take_if_complete()).await;
        rx.await.unwrap_or_else(|_| {
            Err(LlmError::WorkerGone(
                "a gathered request was dropped".into(),
            ))
        })
    }

    fn usage_total(&self) -> Usage {
        self.inner.usage_total()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tooltune_llm::{FinishReason, Message};

    /// A fake model (unit test of the batching logic only): answers each request with its own text and counts
    /// the `chat_many` calls and their sizes.
    struct FakeEcho {
        batches: Mutex<Vec<usize>>,
        calls: AtomicUsize,
    }

    #[async_trait]
    impl ChatModel for FakeEcho {
        fn id(&self) -> String {
            "fake-echo".into()
        }
        async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let text = match req.messages.last() {
                Some(Message::User { content }) => content.clone(),
                _ => String::new(),
            };
            Ok(ChatResponse {
                content: Some(text),
                tool_calls: Vec::new(),
                usage: Usage::default(),
                finish_reason: FinishReason::Stop,
            })
        }
        async fn chat_many(&self, reqs: &[ChatRequest]) -> Vec<Result<ChatResponse, LlmError>> {
            self.batches.lock().expect("lock").push(reqs.len());
            let mut out = Vec::new();
            for r in reqs {
                out.push(self.chat(r).await);
            }
            out
        }
        fn usage_total(&self) -> Usage {
            Usage::default()
        }
    }

    #[tokio::test]
    async fn concurrent_callers_share_one_batch_and_a_finished_caller_is_not_waited_for() {
        let fake = FakeEcho {
            batches: Mutex::new(Vec::new()),
            calls: AtomicUsize::new(0),
        };
        let g = Gather::new(&fake, 3);
        let ask = |i: usize, rounds: usize| {
            let g = &g;
            async move {
                let mut got = Vec::new();
                for r in 0..rounds {
                    let req = ChatRequest::text(vec![Message::user(format!("{i}.{r}"))]);
                    got.push(
                        g.chat(&req)
                            .await
                            .expect("answer")
                            .content
                            .unwrap_or_default(),
                    );
                }
                g.leave().await;
                got
            }
        };
        // Caller 0 asks once, caller 1 twice, caller 2 three times: batches of 3, then 2, then 1.
        let out = futures::future::join_all([ask(0, 1), ask(1, 2), ask(2, 3)]).await;
        assert_eq!(out[0], vec!["0.0"]);
        assert_eq!(out[1], vec!["1.0", "1.1"]);
        assert_eq!(out[2], vec!["2.0", "2.1", "2.2"]);
        assert_eq!(*fake.batches.lock().expect("lock"), vec![3, 2, 1]);
        assert_eq!(fake.calls.load(Ordering::SeqCst), 6);
    }
}
