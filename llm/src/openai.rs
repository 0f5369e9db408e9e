//! The OpenAI-compatible backend (OpenAI, OpenRouter, vLLM, llama.cpp's server, Ollama, `tooltune model
//! serve`), through async-openai's client.
//!
//! async-openai builds and sends the requests; its default retry layer is replaced by [`RetryPolicy`]
//! (through its tower middleware hook) so that the number of retries, the backoff and the handling of
//! `Retry-After` are tooltune's configuration, retries are counted, and a final HTTP failure reaches the
//! caller with its status code. Request and response bodies are tooltune's own subset of the format
//! ([`crate::wire`]), sent through async-openai's bring-your-own-types path.

use crate::wire::{WireResponse, request_to_wire, response_from_wire};
use crate::{ChatModel, ChatRequest, ChatResponse, LlmError, Secret};
use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::HttpRequestFactory;
use async_trait::async_trait;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Semaphore;
use tooltune_core::Usage;

pub use crate::config::DEFAULT_API_KEY_ENV;

/// How to reach an endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiOptions {
    /// Base URL up to and including `/v1` (e.g. `http://127.0.0.1:8080/v1`); `None` = async-openai's default
    /// (OpenAI itself).
    pub base_url: Option<String>,
    /// The model name the endpoint knows.
    pub model: String,
    /// Name of the environment variable that holds the API key. The key is read once, kept in a
    /// [`Secret`] and never logged. An unset variable means "no key" (fine for local servers).
    pub api_key_env: String,
    /// Timeout of one HTTP request.
    pub timeout: Duration,
    /// Retries after the first attempt on 429, 5xx and connection errors.
    pub max_retries: u32,
    /// First backoff delay; doubled on each retry.
    pub initial_backoff: Duration,
    /// Upper bound of one backoff delay, and of a `Retry-After` the server asks for.
    pub max_backoff: Duration,
    /// Requests in flight at once.
    pub concurrency: usize,
}

impl OpenAiOptions {
    /// Options with defaults for `model` at `base_url`.
    pub fn new(model: impl Into<String>, base_url: Option<String>) -> Self {
        OpenAiOptions {
            base_url,
            model: model.into(),
            api_key_env: DEFAULT_API_KEY_ENV.into(),
            timeout: Duration::from_secs(120),
            max_retries: 5,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            concurrency: 4,
        }
    }
}

/// When and how long to wait before retrying.
#[derive(Debug)]
pub struct RetryPolicy {
    max_retries: u32,
    initial: Duration,
    max: Duration,
    retries: AtomicU64,
}

impl RetryPolicy {
    /// The delay before retry number `attempt` (1-based): `Retry-After` when the server gave one, else
    /// exponential backoff; both capped at the maximum.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        retry_after
            .unwrap_or_else(|| {
                self.initial
                    .saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1)))
            })
            .min(self.max)
    }
}

/// `Retry-After` in seconds (integer or decimal). HTTP-date values are ignored (backoff applies).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let v = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    let secs: f64 = v.trim().parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

/// A request that failed for good, kept typed so the backend can report the status.
#[derive(Debug, thiserror::Error)]
#[error("HTTP {status} after {attempts} attempt(s): {body}")]
struct HttpFailure {
    endpoint: String,
    status: u16,
    attempts: u32,
    body: String,
}

/// A request that could not be sent or timed out.
#[derive(Debug, thiserror::Error)]
#[error("{message} (after {attempts} attempt(s))")]
struct TransportFailure {
    endpoint: String,
    message: String,
    attempts: u32,
}

async fn send_with_retry(
    http: reqwest::Client,
    factory: HttpRequestFactory,
    policy: Arc<RetryPolicy>,
) -> Result<reqwest::Response, tower::BoxError> {
    let mut attempt: u32 = 0;
    loop {
        attempt += 1;
        // The factory rebuilds the request (body included) for every attempt.
        let req = factory.build().await?;
        let endpoint = req.url().to_string();
        match http.execute(req).await {
            Ok(resp) => {
                let status = resp.status();
                if status.is_success() {
                    return Ok(resp);
                }
                let retryable = status.as_u16() == 429 || status.is_server_error();
                if retryable && attempt <= policy.max_retries {
                    let delay = policy.delay(attempt, retry_after(resp.headers()));
                    policy.retries.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%endpoint, status = status.as_u16(), attempt, ?delay, "retrying");
                    tokio::time::sleep(delay).await;
                    continue;
                }
                let body: String = resp
                    .text()
                    .await
                    .unwrap_or_default()
                    .chars()
                    .take(500)
                    .collect();
                return Err(Box::new(HttpFailure {
                    endpoint,
                    status: status.as_u16(),
                    attempts: attempt,
                    body,
                }));
            }
            Err(e) => {
                if e.is_connect() && attempt <= policy.max_retries {
                    let delay = policy.delay(attempt, None);
                    policy.retries.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%endpoint, attempt, ?delay, "connection failed; retrying");
                    tokio::time::sleep(delay).await;
                    continue;
                }
                let message = if e.is_timeout() {
                    "request timed out".to_string()
                } else {
                    format!("request failed: {e}")
                };
                return Err(Box::new(TransportFailure {
                    endpoint,
                    message,
                    attempts: attempt,
                }));
            }
        }
    }
}

/// A chat model behind an OpenAI-compatible endpoint.
pub struct OpenAiModel {
    client: Client<OpenAIConfig>,
    opts: OpenAiOptions,
    endpoint: String,
    limit: Semaphore,
    policy: Arc<RetryPolicy>,
    usage: Mutex<Usage>,
    key: Option<Secret>,
}

impl std::fmt::Debug for OpenAiModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiModel")
            .field("endpoint", &self.endpoint)
            .field("model", &self.opts.model)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl OpenAiModel {
    /// A client for `opts`, reading the API key from the configured environment variable.
    pub fn new(opts: OpenAiOptions) -> Result<Self, LlmError> {
        let key = Secret::from_env(&opts.api_key_env);
        Self::with_key(opts, key)
    }

    /// A client for `opts` with an explicit key (`None`: send no key).
    pub fn with_key(opts: OpenAiOptions, key: Option<Secret>) -> Result<Self, LlmError> {
        if opts.model.trim().is_empty() {
            return Err(LlmError::config("model", "is empty"));
        }
        let mut config = OpenAIConfig::new().with_api_key(
            key.as_ref()
                .map(|k| k.expose().to_string())
                .unwrap_or_default(),
        );
        if let Some(base) = &opts.base_url {
            config = config.with_api_base(base.trim_end_matches('/'));
        }
        let endpoint = opts
            .base_url
            .clone()
            .unwrap_or_else(|| "openai-default".into());
        let http = reqwest::Client::builder()
            .timeout(opts.timeout)
            .connect_timeout(opts.timeout.min(Duration::from_secs(10)))
            .build()
            .map_err(|e| LlmError::config("http client", e.to_string()))?;
        let policy = Arc::new(RetryPolicy {
            max_retries: opts.max_retries,
            initial: opts.initial_backoff,
            max: opts.max_backoff,
            retries: AtomicU64::new(0),
        });
        let p = policy.clone();
        let service = tower::service_fn(move |factory: HttpRequestFactory| {
            send_with_retry(http.clone(), factory, p.clone())
        });
        let client = Client::with_config(config).with_http_service(service);
        Ok(OpenAiModel {
            client,
            limit: Semaphore::new(opts.concurrency.max(1)),
            endpoint,
            opts,
            policy,
            usage: Mutex::new(Usage::default()),
            key,
        })
    }

    /// Retries made so far (429, 5xx and connection errors).
    pub fn retries(&self) -> u64 {
        self.policy.retries.load(Ordering::Relaxed)
    }

    fn map_error(&self, e: OpenAIError) -> LlmError {
        if let OpenAIError::Boxed(b) = &e {
            if let Some(f) = b.downcast_ref::<HttpFailure>() {
                return LlmError::Http {
                    endpoint: f.endpoint.clone(),
                    status: f.status,
                    attempts: f.attempts,
                    message: f.body.clone(),
                };
            }
            if let Some(f) = b.downcast_ref::<TransportFailure>() {
                return LlmError::Transport {
                    endpoint: f.endpoint.clone(),
                    message: format!("{} after {} attempt(s)", f.message, f.attempts),
                };
            }
        }
        LlmError::Protocol {
            endpoint: self.endpoint.clone(),
            message: e.to_string(),
        }
    }
}

#[async_trait]
impl ChatModel for OpenAiModel {
    fn id(&self) -> String {
        format!("openai:{}@{}", self.opts.model, self.endpoint)
    }

    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let _permit = self
            .limit
            .acquire()
            .await
            .map_err(|_| LlmError::WorkerGone("the request limiter was closed".into()))?;
        let body = request_to_wire(req, &self.opts.model);
        let wire: WireResponse = self
            .client
            .chat()
            .create_byot(body)
            .await
            .map_err(|e| self.map_error(e))?;
        let resp = response_from_wire(wire).map_err(|message| LlmError::Protocol {
            endpoint: self.endpoint.clone(),
            message,
        })?;
        for c in &resp.tool_calls {
            if !req.tools.iter().any(|t| t.name == c.name) {
                tracing::warn!(tool = %c.name, "the endpoint called a tool that was not offered");
            }
        }
        if let Ok(mut u) = self.usage.lock() {
            u.prompt_tokens += resp.usage.prompt_tokens;
            u.completion_tokens += resp.usage.completion_tokens;
        }
        Ok(resp)
    }

    // No `score_tool_choice`: chat endpoints expose at most top-k log-probabilities of generated tokens, not the
    // probability of arbitrary continuations, so exact selection scores are not available here (the default).

    fn usage_total(&self) -> Usage {
        self.usage.lock().map(|u| *u).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_is_capped_and_honours_retry_after() {
        let p = RetryPolicy {
            max_retries: 5,
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            retries: AtomicU64::new(0),
        };
        assert_eq!(p.delay(1, None), Duration::from_millis(100));
        assert_eq!(p.delay(3, None), Duration::from_millis(400));
        assert_eq!(p.delay(10, None), Duration::from_secs(1));
        assert_eq!(
            p.delay(1, Some(Duration::from_millis(250))),
            Duration::from_millis(250)
        );
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(90))),
            Duration::from_secs(1)
        );
        let mut h = reqwest::header::HeaderMap::new();
        h.insert(
            reqwest::header::RETRY_AFTER,
            "0.25".parse().expect("header"),
        );
        assert_eq!(retry_after(&h), Some(Duration::from_millis(250)));
        h.insert(
            reqwest::header::RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().expect("header"),
        );
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn debug_never_shows_the_key() {
        let o = OpenAiOptions::new("m", Some("http://127.0.0.1:9/v1".into()));
        let m = OpenAiModel::with_key(o, Some(Secret::new("sk-123"))).expect("builds");
        let dbg = format!("{m:?}");
        assert!(dbg.contains("***") && !dbg.contains("sk-123"), "{dbg}");
        assert_eq!(m.id(), "openai:m@http://127.0.0.1:9/v1");
    }
}
