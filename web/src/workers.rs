//! The dashboard's workers page (`GET /workers`) and its JSON (`GET /api/workers`): the `tooltune worker` processes
//! as they last reported themselves (last seen, jobs done, failures) and each job queue's depth, for runs started
//! with workers. Worker ids and model names come from other machines: the template escapes them.

use crate::pages::PageError;
use crate::{AppState, WebError};
use axum::Json;
use axum::extract::State;
use axum::response::Html;
use minijinja::context;
use serde::Serialize;
use serde_json::Value;
use tooltune_store::{Backend, WorkerRow};

/// How long a worker may go without reporting (it reports every 5 s) before the page calls it gone.
const GONE_AFTER_S: i64 = 30;

/// One worker, with how long ago it was last seen.
#[derive(Debug, Serialize)]
struct WorkerView {
    #[serde(flatten)]
    row: WorkerRow,
    seen_s_ago: Option<i64>,
    /// `state`, or `gone` for a worker that stopped reporting without saying it stopped (killed, cut off).
    status: String,
}

/// One queue: the model and suite it serves, and its jobs.
#[derive(Debug, Serialize)]
struct QueueView {
    queue: String,
    model: String,
    suite: String,
    waiting: Option<i64>,
    in_flight: Option<i64>,
    done: i64,
    given_up: i64,
}

#[derive(Debug, Serialize)]
struct WorkersView {
    postgres: bool,
    workers: Vec<WorkerView>,
    queues: Vec<QueueView>,
    /// Why queue depths are missing, when they are.
    queue_error: Option<String>,
}

impl WorkerView {
    fn of(row: WorkerRow, now: chrono::DateTime<chrono::Utc>) -> Self {
        let (seen_s_ago, status) = status_of(&row, now);
        WorkerView {
            row,
            seen_s_ago,
            status,
        }
    }
}

fn status_of(row: &WorkerRow, now: chrono::DateTime<chrono::Utc>) -> (Option<i64>, String) {
    let ago = chrono::DateTime::parse_from_rfc3339(&row.last_seen)
        .ok()
        .map(|t| (now - t.with_timezone(&chrono::Utc)).num_seconds());
    let status = if row.state != "stopped" && ago.is_none_or(|a| a > GONE_AFTER_S) {
        "gone".to_string()
    } else {
        row.state.clone()
    };
    (ago, status)
}

async fn view(s: &AppState) -> Result<WorkersView, WebError> {
    if s.store.backend() != Backend::Postgres {
        return Ok(WorkersView {
            postgres: false,
            workers: Vec::new(),
            queues: Vec::new(),
            queue_error: None,
        });
    }
    let now = chrono::Utc::now();
    let workers = s
        .store
        .workers()
        .await?
        .into_iter()
        .map(|row| WorkerView::of(row, now))
        .collect();
    let counts = s.store.job_result_counts().await?;
    let mut queue_error = None;
    let queue = match s
        .queue
        .get_or_try_init(|| tooltune_worker::Queue::connect(s.store.database_url()))
        .await
    {
        Ok(q) => Some(q),
        Err(e) => {
            queue_error = Some(e.to_string());
            None
        }
    };
    let mut queues = Vec::new();
    for q in s.store.job_queues().await? {
        let depth = match queue {
            Some(queue) => match queue.depth(&q.queue).await {
                Ok(d) => Some(d),
                Err(e) => {
                    queue_error = Some(e.to_string());
                    None
                }
            },
            None => None,
        };
        let suite = s
            .store
            .job_suite(&q.suite_digest)
            .await?
            .map_or_else(|| q.suite_digest.chars().take(12).collect(), |j| j.name);
        let (done, given_up) = counts.get(&q.queue).copied().unwrap_or((0, 0));
        queues.push(QueueView {
            queue: q.queue,
            model: q.model,
            suite,
            waiting: depth.map(|d| d.waiting),
            in_flight: depth.map(|d| d.in_flight),
            done,
            given_up,
        });
    }
    Ok(WorkersView {
        postgres: true,
        workers,
        queues,
        queue_error,
    })
}

fn page_html(
    env: &minijinja::Environment<'static>,
    v: &WorkersView,
) -> Result<String, minijinja::Error> {
    env.get_template("workers.html")?.render(context! { v })
}

/// `GET /workers`.
pub(crate) async fn page(State(s): State<AppState>) -> Result<Html<String>, PageError> {
    let v = view(&s).await?;
    Ok(Html(page_html(&s.templates, &v)?))
}

/// `GET /api/workers`: the same as JSON.
pub(crate) async fn api(State(s): State<AppState>) -> Result<Json<Value>, WebError> {
    let v = view(&s).await?;
    Ok(Json(serde_json::to_value(v).unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, state: &str, last_seen: &str) -> WorkerRow {
        WorkerRow {
            id: id.into(),
            host: "h".into(),
            model: "m<i>".into(),
            started_at: "2026-12-04T10:00:00.000Z".into(),
            last_seen: last_seen.into(),
            jobs_done: 7,
            failures: 1,
            state: state.into(),
        }
    }

    #[test]
    fn a_worker_that_stopped_reporting_is_gone_and_names_are_escaped() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-12-04T10:01:00Z")
            .expect("time")
            .with_timezone(&chrono::Utc);
        let fresh = row("<script>x</script>", "busy", "2026-12-04T10:00:55.000Z");
        let silent = row("w2", "busy", "2026-12-04T10:00:00.000Z");
        let stopped = row("w3", "stopped", "2026-12-04T10:00:00.000Z");
        assert_eq!(status_of(&fresh, now), (Some(5), "busy".into()));
        assert_eq!(status_of(&silent, now), (Some(60), "gone".into()));
        assert_eq!(status_of(&stopped, now), (Some(60), "stopped".into()));
        let workers = [fresh, silent, stopped]
            .into_iter()
            .map(|row| WorkerView::of(row, now))
            .collect();
        let v = WorkersView {
            postgres: true,
            workers,
            queues: vec![QueueView {
                queue: "tt_abc".into(),
                model: "m".into(),
                suite: "contractor".into(),
                waiting: Some(3),
                in_flight: Some(2),
                done: 40,
                given_up: 1,
            }],
            queue_error: None,
        };
        let html = page_html(&crate::pages::templates().expect("templates"), &v).expect("render");
        assert!(!html.contains("<script>x"), "{html}");
        assert!(html.contains("&lt;script&gt;x"), "{html}");
        assert!(html.contains("m&lt;i&gt;"), "{html}");
        assert!(html.contains(">gone<"), "{html}");
        assert!(html.contains("tt_abc") && html.contains(">40<"), "{html}");
        let sqlite = WorkersView {
            postgres: false,
            workers: Vec::new(),
            queues: Vec::new(),
            queue_error: None,
        };
        let html =
            page_html(&crate::pages::templates().expect("templates"), &sqlite).expect("render");
        assert!(html.contains("need a PostgreSQL store"), "{html}");
    }
}
