//! The tooltune web service: a JSON API, server-sent progress events and HTML pages over the trace store, with
//! optimisation runs as jobs inside the server's process.
//!
//! One binary, no front-end build: the pages are minijinja templates compiled into the crate, the little script
//! the run page needs is a static file served from memory. This is the only crate that knows HTTP; it talks to the
//! store, the ingest readers and the optimizer driver through their library APIs and adds nothing to their data.
//!
//! Security model (see `docs/api.md`): write endpoints need `Authorization: Bearer $TOOLTUNE_TOKEN` when a token
//! is configured; without one the server only binds a loopback address. A loopback server also refuses requests
//! whose `Host` is not a loopback name (DNS rebinding), and every write refuses a cross-site `Origin` (CSRF).
//! Bodies are size-limited. Runs can only use suites from the configured folder and models the operator allowed,
//! because a suite starts a program and a model spec decides where an API key is sent.

mod api;
mod auth;
mod jobs;
mod pages;
mod render;
mod sse;
mod variants;
mod view;
mod workers;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::{Semaphore, watch};
use tooltune_store::{Backend, Store, StoreError};

pub use auth::Token;

/// Everything that can go wrong in the web service. Each variant maps to one HTTP status; a 500 answers with a
/// generic message and the details go to the log only.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebError {
    /// The store failed (or rejected an ingest, which is a client error: see [`WebError::status`]).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The optimizer driver failed.
    #[error(transparent)]
    Driver(#[from] tooltune_driver::DriverError),
    /// The report of runs could not be built.
    #[error(transparent)]
    Report(#[from] tooltune_report::ReportError),
    /// A template failed to render.
    #[error("rendering a page: {0}")]
    Template(#[from] minijinja::Error),
    /// The listening socket could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP server stopped with an IO error.
    #[error("the HTTP server stopped: {0}")]
    Serve(#[source] std::io::Error),
    /// The server's own configuration is refused (for example a public address without a token).
    #[error("{0}")]
    Config(String),
    /// The request is malformed or asks for something not allowed.
    #[error("{0}")]
    BadRequest(String),
    /// Nothing by that name.
    #[error("{0} not found")]
    NotFound(String),
    /// A write without the right bearer token.
    #[error("this endpoint needs `Authorization: Bearer <TOOLTUNE_TOKEN>`")]
    Unauthorized,
    /// A request the server refuses whoever sends it (a foreign `Host` or `Origin`).
    #[error("{0}")]
    Forbidden(String),
    /// The body is over the endpoint's limit.
    #[error("the request body is over the limit of {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The request conflicts with the resource's state (stopping a run that is not running here).
    #[error("{0}")]
    Conflict(String),
    /// Something that cannot happen short of a bug or a shutdown (a task that did not come back, a value that
    /// did not serialise).
    #[error("{0}")]
    Internal(String),
}

impl WebError {
    /// The HTTP status this error answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            WebError::Store(StoreError::Rejected { .. }) => StatusCode::UNPROCESSABLE_ENTITY,
            WebError::Store(StoreError::Ingest(_)) => StatusCode::BAD_REQUEST,
            WebError::Report(tooltune_report::ReportError::NoSuchRun(_)) => StatusCode::NOT_FOUND,
            WebError::Report(tooltune_report::ReportError::NoRuns) => StatusCode::BAD_REQUEST,
            WebError::BadRequest(_) => StatusCode::BAD_REQUEST,
            WebError::NotFound(_) => StatusCode::NOT_FOUND,
            WebError::Unauthorized => StatusCode::UNAUTHORIZED,
            WebError::Forbidden(_) => StatusCode::FORBIDDEN,
            WebError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            WebError::Conflict(_) => StatusCode::CONFLICT,
            WebError::Config(_) => StatusCode::BAD_REQUEST,
            WebError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// What the client is told: the error itself for client errors, nothing internal for server errors.
    pub(crate) fn public_message(&self) -> String {
        if self.status().is_server_error() {
            "internal error: see the server's log".to_string()
        } else {
            match self {
                // The store's message repeats every record; the response lists them as data instead.
                WebError::Store(StoreError::Rejected { errors, .. }) => format!(
                    "{} invalid record(s); nothing of this request was stored",
                    errors.len()
                ),
                e => e.to_string(),
            }
        }
    }

    /// Logs a server error (a client error is the client's business and is not logged).
    pub(crate) fn log(&self) {
        if self.status().is_server_error() {
            tracing::error!("request failed: {self}");
        }
    }
}

impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        self.log();
        let mut body = serde_json::json!({ "error": self.public_message() });
        if let WebError::Store(StoreError::Rejected { errors, .. }) = &self {
            body["records"] = serde_json::to_value(errors).unwrap_or_default();
        }
        let mut response = (self.status(), axum::Json(body)).into_response();
        if matches!(self, WebError::Unauthorized) {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

/// How the service runs. Build one with [`ServeConfig::new`] and change what differs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Where to listen. Port 0 picks a free port ([`Server::local_addr`] tells which).
    pub bind: SocketAddr,
    /// The bearer token write endpoints require; required for a non-loopback `bind`.
    pub token: Option<Token>,
    /// The folder runs take their suites from (`POST /api/runs` names a suite by file stem).
    pub suites_dir: PathBuf,
    /// Model specs a run may use (`local`, `local:fast`, `openai:MODEL@URL`); the first is the default.
    pub models: Vec<String>,
    /// The environment variable holding the API key of OpenAI-compatible models.
    pub api_key_env: Option<String>,
    /// Largest `POST /api/traces` body, in bytes.
    pub max_trace_bytes: usize,
    /// Largest body of every other endpoint, in bytes.
    pub max_json_bytes: usize,
    /// Runs executing at once; further runs wait in a queue. The local model uses every core, so one by default.
    pub max_jobs: usize,
    /// Resume, at start, the runs the store lists as still running (a previous server was stopped or crashed).
    pub resume: bool,
}

impl ServeConfig {
    /// Defaults: no token, suites from `datasets/suites`, the local models, 32 MiB of traces per request.
    pub fn new(bind: SocketAddr) -> ServeConfig {
        ServeConfig {
            bind,
            token: None,
            suites_dir: PathBuf::from("datasets/suites"),
            models: vec!["local".into(), "local:fast".into()],
            api_key_env: None,
            max_trace_bytes: 32 << 20,
            max_json_bytes: 64 << 10,
            max_jobs: 1,
            resume: true,
        }
    }

    /// Refuses configurations that would be unsafe or cannot work.
    fn validate(&self) -> Result<(), WebError> {
        if self.token.is_none() && !self.bind.ip().is_loopback() {
            return Err(WebError::Config(format!(
                "refusing to listen on {} without a token: set TOOLTUNE_TOKEN (at least {} characters) or bind a \
                 loopback address such as 127.0.0.1",
                self.bind,
                Token::MIN_LEN
            )));
        }
        if self.models.is_empty() {
            return Err(WebError::Config(
                "no model is allowed for runs: name at least one".into(),
            ));
        }
        if self.max_jobs == 0 {
            return Err(WebError::Config("max_jobs must be at least 1".into()));
        }
        Ok(())
    }
}

/// What every handler shares.
pub(crate) struct Inner {
    pub(crate) store: Store,
    pub(crate) cfg: ServeConfig,
    pub(crate) jobs: jobs::Jobs,
    pub(crate) templates: minijinja::Environment<'static>,
    /// Flips to `true` when the server shuts down, so that open event streams end instead of holding it open.
    pub(crate) shutdown: watch::Receiver<bool>,
    /// Imports wait here: SQLite has one writer, and queueing in the service is cheaper than in the database's
    /// busy handler.
    pub(crate) ingest_gate: Semaphore,
    /// The job queue of runs with workers, connected on the first look at `/workers` (PostgreSQL stores only).
    pub(crate) queue: tokio::sync::OnceCell<tooltune_worker::Queue>,
}

/// The state handed to handlers.
pub(crate) type AppState = Arc<Inner>;

/// A running service.
pub struct Server {
    addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    jobs: jobs::Jobs,
}

impl Server {
    /// Validates the configuration, binds the address, resumes unfinished runs (when asked) and starts serving.
    pub async fn start(store: Store, cfg: ServeConfig) -> Result<Server, WebError> {
        cfg.validate()?;
        let listener = tokio::net::TcpListener::bind(cfg.bind)
            .await
            .map_err(|source| WebError::Bind {
                addr: cfg.bind,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| WebError::Bind {
            addr: cfg.bind,
            source,
        })?;
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let jobs = jobs::Jobs::new(store.clone(), &cfg);
        let writers = match store.backend() {
            Backend::Sqlite => 1,
            // The PostgreSQL pool has 8 connections: leave some for the pages.
            Backend::Postgres => 4,
        };
        let state: AppState = Arc::new(Inner {
            store,
            jobs: jobs.clone(),
            templates: pages::templates()?,
            shutdown: shutdown_rx.clone(),
            ingest_gate: Semaphore::new(writers),
            queue: tokio::sync::OnceCell::new(),
            cfg,
        });
        if state.cfg.resume {
            let resumed = jobs.resume_unfinished().await?;
            if !resumed.is_empty() {
                tracing::info!("resuming {} unfinished run(s)", resumed.len());
            }
        }
        let app = router(state);
        let mut stop = shutdown_rx;
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await
        });
        Ok(Server {
            addr,
            shutdown: shutdown_tx,
            task,
            jobs,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving: open event streams end, running jobs are abandoned where they are (their runs stay
    /// `running` in the store, and the next server resumes them from their last checkpoint).
    pub async fn shutdown(self) -> Result<(), WebError> {
        let _ = self.shutdown.send(true);
        self.jobs.abandon_all();
        match self.task.await {
            Ok(r) => r.map_err(WebError::Serve),
            // The serving task cannot panic short of a bug in axum; report it as an IO error rather than panic.
            Err(e) => Err(WebError::Serve(std::io::Error::other(e.to_string()))),
        }
    }
}

/// The routes. Pages and the API share one router; the guard decides who may write.
fn router(state: AppState) -> Router {
    let trace_limit = state.cfg.max_trace_bytes;
    let json_limit = state.cfg.max_json_bytes;
    Router::new()
        .route("/", get(pages::home))
        .route("/tools/{name}", get(pages::tool))
        .route("/runs/{id}", get(pages::run))
        .route("/runs/{id}/live", get(pages::run_live))
        .route("/runs/{id}/report", get(pages::run_report))
        .route("/report", get(pages::report))
        .route("/trajectories/{id}", get(pages::trajectory))
        .route("/variants", get(variants::page))
        .route("/workers", get(workers::page))
        .route("/static/app.css", get(pages::css))
        .route("/static/app.js", get(pages::js))
        .route("/api/health", get(api::health))
        .route(
            "/api/traces",
            post(api::post_traces).layer(DefaultBodyLimit::max(trace_limit)),
        )
        .route("/api/tools", get(api::tools))
        .route("/api/suites", get(api::suites))
        .route("/api/runs", get(api::runs).post(api::start_run))
        .route("/api/runs/{id}", get(api::run))
        .route("/api/runs/{id}/events", get(sse::events))
        .route("/api/runs/{id}/stop", post(api::stop_run))
        .route("/api/trajectories/{id}", get(api::trajectory))
        .route("/api/report", get(api::report))
        .route("/api/variants", get(variants::api))
        .route("/api/workers", get(workers::api))
        .fallback(api::not_found)
        .layer(DefaultBodyLimit::max(json_limit))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::guard,
        ))
        .with_state(state)
}
