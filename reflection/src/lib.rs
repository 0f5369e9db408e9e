//! Reflection: from a candidate's evaluated runs, ask a reflector model why runs failed (or why the tool was
//! or was not picked) and for a new description of one tool.
//!
//! [`reflect`] selects a few runs ([`dataset`]), renders one short prompt from the templates in
//! `templates/` ([`prompt`]), sends it to any [`ChatModel`], and parses the reply leniently ([`parse`]). A
//! reply without a usable description is retried: the same prompt again with a short note naming the fault,
//! sampled, up to [`ReflectionOptions::max_attempts`] requests in all, except that a reply which diagnosed but
//! never got to a description is answered in the same conversation, asking for the description alone; if none
//! works the [`Proposal`]
//! records the failure with every prompt and reply. Nothing is dropped silently: the driver stores the proposal with the candidate.
//!
//! The goals share each template ([`Style::Runs`], [`Style::Scope`]); the only difference is the sentence
//! stating the goal (`templates/goal.jinja`, included by both). The prompt says
//! nothing else about honesty or promotion, so whatever the reflector writes under each goal is what that
//! goal asks for (issue 6 measures exactly this).

pub mod dataset;
pub mod heuristics;
pub mod judge;
pub mod parse;
pub mod prompt;
pub mod rewrite;

pub use dataset::{Limits, ReflectiveExample, Relation, RunRecord};
pub use parse::{ParseContext, ParsedReply, Rejection, parse_reply};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tooltune_core::Usage;
use tooltune_llm::{ChatModel, ChatRequest, FinishReason, LlmError, Message, ReplyFormat};

/// Version of the templates in `templates/`, stored with every proposal. Change it whenever a template
/// changes (a unit test pins the templates' hash to it).
pub const TEMPLATE_VERSION: &str = "reflect-v8";

/// What the reflector is asked to improve. The lead maps `tooltune_objectives::Objective` onto this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Goal {
    /// The agent should solve as many tasks as possible.
    TaskSuccess,
    /// The agent should choose the tool under study as often as possible.
    Selection,
    /// The agent's first move should be the right one: the tool under study for the tasks it covers, another
    /// tool or none for the rest.
    Routing,
}

impl Goal {
    /// The name the template compares against, and the serialised form.
    pub fn as_str(self) -> &'static str {
        match self {
            Goal::TaskSuccess => "task_success",
            Goal::Selection => "selection",
            Goal::Routing => "routing",
        }
    }
}

/// What the reflector is shown and asked for.
///
/// `Runs` shows a few whole runs (calls, results, answers, checks) and asks for a new description in free form.
/// `Scope` shows many questions at a line each (whose they are and what the agent did first) and asks for a
/// description that names the kinds of questions the tool is for. Why both: on the contractor suite the 1.5B
/// reflector, shown three runs, mostly restated the seed ("Search the company's internal documentation for the
/// information needed to answer the task"), while what moved the agent was a scope in general words ("Use this
/// for weather forecasts, sports results ... anything public": off-target selection 15/23 -> 8/23, hand-written,
/// issue 25). Naming what a list of questions have in common is a task a small model can do from a short prompt.
/// The goal sentence is the same in both templates, so the two goals still differ in that sentence alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Style {
    /// A few whole runs; `reflect.jinja`.
    #[default]
    Runs,
    /// Many questions, one line each; `scope.jinja`.
    Scope,
}

/// Knobs of one reflection. The defaults keep the prompt near 400-600 tokens for a 1.5B model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReflectionOptions {
    /// Which template: whole runs or a list of questions.
    pub style: Style,
    /// Most runs shown ([`Style::Runs`]).
    pub max_examples: usize,
    /// Most questions listed ([`Style::Scope`]): a line each, so many more fit than whole runs.
    pub scope_examples: usize,
    /// How much of each run's text is shown.
    pub limits: Limits,
    /// Longest input schema shown, in characters.
    pub schema_chars: usize,
    /// Longest description accepted, in characters (stated in the prompt).
    pub max_description_chars: usize,
    /// Replies asked for in all: the first plus retries.
    pub max_attempts: usize,
    /// Generation limit per reply.
    pub max_tokens: u32,
    /// Sampling temperature of the first reply (`0` = greedy).
    pub temperature: f32,
    /// Sampling temperature of retries: a greedy retry of the same prompt would mostly repeat the first
    /// reply, the note naming the fault being a small change to a long prompt.
    pub retry_temperature: f32,
    /// Sampling seed; attempt `n` uses `seed + n`, so a run is reproducible on a backend that honours seeds.
    pub seed: u64,
}

impl Default for ReflectionOptions {
    fn default() -> Self {
        ReflectionOptions {
            style: Style::Runs,
            max_examples: 3,
            scope_examples: 12,
            limits: Limits::default(),
            schema_chars: 300,
            max_description_chars: 400,
            max_attempts: 3,
            max_tokens: 180,
            temperature: 0.0,
            retry_temperature: 0.7,
            seed: 0,
        }
    }
}

/// One reflection to perform: the tool, what it says now, the goal, and the runs to learn from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReflectionRequest {
    /// The tool under study.
    pub tool: String,
    /// Its current description (the parent candidate's).
    pub current_description: String,
    /// Its input schema (`null` or `{}` when unknown).
    pub input_schema: Value,
    /// What the new description should achieve.
    pub goal: Goal,
    /// The tool the selection goal is about, when it is not `tool`: with every tool of a server editable, a
    /// competitor's text is rewritten so that the agent picks the target more often. `None`: `tool` itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The evaluated runs to choose from.
    pub examples: Vec<ReflectiveExample>,
    /// Knobs.
    #[serde(default)]
    pub options: ReflectionOptions,
}

/// One request to the reflector and its answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// The user message sent in this attempt: the reflection prompt, followed on retries by a note naming
    /// what was wrong with the previous reply. (The system message is [`Proposal::system`].)
    pub prompt: String,
    /// Set when this attempt continued the previous one's conversation: after `prompt` and the previous
    /// attempt's reply, this message was sent (the previous reply had a diagnosis but no description).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow_up: Option<String>,
    /// The model's reply text (empty when it wrote none).
    pub reply: String,
    /// Why the reply was not usable; `None` for the accepted reply.
    pub error: Option<String>,
    /// The rejection, as data.
    pub rejection: Option<Rejection>,
    /// Tokens this attempt used.
    pub usage: Usage,
    /// The reply stopped at the token limit.
    pub truncated: bool,
}

/// The outcome of a reflection: a new description, or a recorded failure to get one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    /// The tool the proposal is for.
    pub tool: String,
    /// The goal it was asked under.
    pub goal: Goal,
    /// The new description, `None` when no reply gave a usable one.
    pub description: Option<String>,
    /// The reflector's diagnosis (from the accepted reply, else the last reply that had one).
    pub diagnosis: Option<String>,
    /// Indices into the request's examples of the runs shown, in prompt order.
    pub shown: Vec<usize>,
    /// The system message of the conversation.
    pub system: String,
    /// Every attempt, in order.
    pub attempts: Vec<Attempt>,
    /// Tokens used over all attempts.
    pub tokens: Usage,
    /// [`TEMPLATE_VERSION`] at the time.
    pub template_version: String,
    /// The reflector's id ([`ChatModel::id`]).
    pub model: String,
}

impl Proposal {
    /// Whether a usable description came out.
    pub fn succeeded(&self) -> bool {
        self.description.is_some()
    }

    /// Prompt plus completion tokens, the unit of the optimizer's reflection budget.
    pub fn total_tokens(&self) -> u64 {
        self.tokens.prompt_tokens + self.tokens.completion_tokens
    }
}

/// Why a reflection could not be carried out at all. A reply that does not parse is not an error: it is a
/// [`Proposal`] without a description.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReflectionError {
    /// The request is unusable.
    #[error("reflection request: {field}: {message}")]
    InvalidRequest {
        /// The request field, e.g. `examples` or `options.max_attempts`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// A template failed to compile or render (a bug in `templates/`).
    #[error("template {name}{}: {message}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
    Template {
        /// The template file.
        name: String,
        /// The line, when known.
        line: Option<usize>,
        /// The template engine's message.
        message: String,
    },
    /// The reflector model failed. `partial` holds the attempts made before the failure and their tokens,
    /// so the driver can still record them.
    #[error("reflector {model}, tool `{tool}`, attempt {attempt}: {source}")]
    Model {
        /// The reflector's id.
        model: String,
        /// The tool under study.
        tool: String,
        /// 1-based attempt number that failed.
        attempt: usize,
        /// The backend's error.
        #[source]
        source: LlmError,
        /// Everything recorded up to the failure.
        partial: Box<Proposal>,
    },
    /// The judge model failed on every run it was asked about (see [`judge::judge_many`]).
    #[error("judge {model}: {source}")]
    Judge {
        /// The judge's id.
        model: String,
        /// The backend's error.
        #[source]
        source: LlmError,
    },
}

impl ReflectionError {
    pub(crate) fn template(name: &str, e: &minijinja::Error) -> Self {
        ReflectionError::Template {
            name: name.to_string(),
            line: e.line(),
            message: e.to_string(),
        }
    }
}

impl ReflectionRequest {
    fn validate(&self) -> Result<(), ReflectionError> {
        let bad = |field: &str, message: &str| ReflectionError::InvalidRequest {
            field: field.into(),
            message: message.into(),
        };
        if self.tool.trim().is_empty() {
            return Err(bad("tool", "is empty"));
        }
        if self.examples.is_empty() {
            return Err(bad(
                "examples",
                "is empty: reflection needs at least one evaluated run",
            ));
        }
        if self.options.style == Style::Scope && self.options.scope_examples == 0 {
            return Err(bad(
                "options.scope_examples",
                "is 0: no question could be listed",
            ));
        }
        if self.options.max_examples == 0 {
            return Err(bad("options.max_examples", "is 0: no run could be shown"));
        }
        if self.options.max_attempts == 0 {
            return Err(bad(
                "options.max_attempts",
                "is 0: the reflector would never be asked",
            ));
        }
        if self.options.max_description_chars == 0 {
            return Err(bad(
                "options.max_description_chars",
                "is 0: no description could be accepted",
            ));
        }
        Ok(())
    }

    /// The runs that will be shown and what of them: useful to inspect a prompt without a model.
    pub fn records(&self) -> Vec<RunRecord> {
        let (cap, limits) = match self.options.style {
            Style::Runs => (self.options.max_examples, self.options.limits),
            // One line a question: the task cut shorter, the rest of the run is not shown.
            Style::Scope => (
                self.options.scope_examples,
                Limits {
                    task_chars: self.options.limits.task_chars.min(160),
                    ..self.options.limits
                },
            ),
        };
        let about = self.goal_tool();
        dataset::select_about(&self.examples, &self.tool, about, self.goal, cap)
            .into_iter()
            .filter_map(|i| {
                RunRecord::build_about(&self.examples, i, &self.tool, about, self.goal, &limits)
            })
            .collect()
    }

    /// The tool whose selection the goal is about: the target under the selection goal, else `tool`.
    pub fn goal_tool(&self) -> &str {
        match (self.goal, &self.target) {
            (Goal::Selection, Some(t)) => t,
            _ => &self.tool,
        }
    }

    /// Renders the prompt this request would send first.
    pub fn render(&self) -> Result<prompt::RenderedPrompt, ReflectionError> {
        self.validate()?;
        let runs = self.records();
        render_with(self, &runs)
    }
}

fn render_with(
    req: &ReflectionRequest,
    runs: &[RunRecord],
) -> Result<prompt::RenderedPrompt, ReflectionError> {
    prompt::render(&prompt::PromptInput {
        tool: &req.tool,
        target: req.goal_tool(),
        current_description: &req.current_description,
        input_schema: &req.input_schema,
        goal: req.goal,
        style: req.options.style,
        runs,
        max_chars: req.options.max_description_chars,
        schema_chars: req.options.schema_chars,
    })
}

fn add(total: &mut Usage, u: Usage) {
    total.prompt_tokens += u.prompt_tokens;
    total.completion_tokens += u.completion_tokens;
}

/// Asks `model` for a diagnosis and a new description of `req.tool`.
///
/// Returns a [`Proposal`] whether or not a usable description came out; `Err` only for an unusable request,
/// a template bug, or a backend failure (which carries the attempts made so far).
pub async fn reflect(
    model: &dyn ChatModel,
    req: &ReflectionRequest,
) -> Result<Proposal, ReflectionError> {
    req.validate()?;
    let opts = &req.options;
    let runs = req.records();
    let rendered = render_with(req, &runs)?;
    let mut proposal = Proposal {
        tool: req.tool.clone(),
        goal: req.goal,
        description: None,
        diagnosis: None,
        shown: runs.iter().map(|r| r.index).collect(),
        system: rendered.system.clone(),
        attempts: Vec::new(),
        tokens: Usage::default(),
        template_version: TEMPLATE_VERSION.to_string(),
        model: model.id(),
    };
    let ctx = ParseContext {
        tool: &req.tool,
        current_description: &req.current_description,
        echo_markers: &rendered.echo_markers,
        max_chars: opts.max_description_chars,
    };
    // Each retry is a fresh conversation: the same prompt followed by a short note naming what was wrong
    // with the last reply. Shown its own rejected reply, the 1.5B model repeated it word for word (greedy
    // and sampled alike, measured on the contractor case); without it, a sampled retry differs.
    //
    // One exception: a reply that wrote its DIAGNOSIS and stopped there (or ran out of tokens in it) is
    // answered in the same conversation, asking for the description alone. In a demo run on an AVX2-only host
    // the 1.5B wrote no description in 7 of 18 replies, fresh retries included. Asked for the description
    // after its own diagnosis (greedy), it wrote a DESCRIPTION line in 5 of the 5 conversations tried, and 3
    // of the 5 passed every check; asked for "two or three sentences", 4 of 5 were over the length limit. The
    // diagnosis is then the reasoning the description follows from, as the prompt intends.
    let mut user = rendered.user.clone();
    // The reply a follow-up answers, and the follow-up message.
    let mut follow: Option<(String, String)> = None;
    for attempt in 1..=opts.max_attempts {
        let mut messages = vec![
            Message::system(rendered.system.clone()),
            Message::user(user.clone()),
        ];
        if let Some((earlier, message)) = &follow {
            messages.push(Message::Assistant {
                content: Some(earlier.clone()),
                tool_calls: Vec::new(),
            });
            messages.push(Message::user(message.clone()));
        }
        let mut chat = ChatRequest::text(messages);
        // The embedded model writes under the reply's format as a grammar (no missing DESCRIPTION line, no echoed
        // placeholder); the description's line may run a quarter past the limit, where `trim_to_sentences` cuts
        // it back to whole sentences rather than the grammar cutting it mid-word.
        let format = reply_format(follow.is_some(), opts.max_description_chars);
        chat.max_tokens = opts.max_tokens.max(format.max_tokens());
        chat.format = Some(format);
        // A follow-up is a new question, not a repeat of one already answered: no need to sample.
        chat.temperature = if attempt == 1 || follow.is_some() {
            opts.temperature
        } else {
            opts.retry_temperature
        };
        chat.seed = Some(opts.seed.wrapping_add(attempt as u64));
        let resp = match model.chat(&chat).await {
            Ok(r) => r,
            Err(source) => {
                return Err(ReflectionError::Model {
                    model: proposal.model.clone(),
                    tool: req.tool.clone(),
                    attempt,
                    source,
                    partial: Box::new(proposal),
                });
            }
        };
        add(&mut proposal.tokens, resp.usage);
        let reply = resp.content.unwrap_or_default();
        let truncated = resp.finish_reason == FinishReason::Length;
        let parsed = parse_reply(&reply, &ctx);
        if let Some(d) = &parsed.diagnosis {
            proposal.diagnosis = Some(whole_sentences(d, DIAGNOSIS_MAX_CHARS as usize));
        }
        let (error, rejection) = match &parsed.description {
            Ok(d) => {
                proposal.description = Some(d.clone());
                (None, None)
            }
            Err(r) => {
                let mut e = r.to_string();
                if truncated {
                    e.push_str(" (the reply stopped at the token limit)");
                }
                (Some(e), Some(r.clone()))
            }
        };
        let diagnosed_only =
            rejection == Some(Rejection::NoDescription) && parsed.diagnosis.is_some();
        let follow_up = follow.take().map(|(_, message)| message);
        let continued = follow_up.is_some();
        proposal.attempts.push(Attempt {
            prompt: user.clone(),
            follow_up,
            reply: reply.clone(),
            error: error.clone(),
            rejection,
            usage: resp.usage,
            truncated,
        });
        match error {
            None => return Ok(proposal),
            // Only once: a follow-up that again gives no description starts over like any other fault.
            Some(_) if diagnosed_only && !continued => {
                follow = Some((
                    reply,
                    prompt::render_describe(&req.tool, opts.max_description_chars)?,
                ));
            }
            Some(e) => {
                let note = prompt::render_retry(&req.tool, &e, opts.max_description_chars)?;
                user = format!("{}\n\n{note}", rendered.user);
            }
        }
    }
    Ok(proposal)
}

/// The format of a reflection reply: `DIAGNOSIS` then `DESCRIPTION`, or the description alone when it answers
/// the follow-up that asks only for it.
pub fn reply_format(description_only: bool, max_description_chars: usize) -> ReplyFormat {
    let description =
        u32::try_from(max_description_chars + max_description_chars / 4).unwrap_or(u32::MAX);
    if description_only {
        ReplyFormat::labelled(&[("DESCRIPTION", description)])
    } else {
        ReplyFormat::labelled(&[
            ("DIAGNOSIS", DIAGNOSIS_MAX_CHARS),
            ("DESCRIPTION", description),
        ])
    }
}

/// A diagnosis the grammar cut at its limit, back to its whole sentences the way an overlong description is
/// (`trim_to_sentences`), or marked as cut when that would lose too much: it is read in reports, where a sentence
/// broken mid-word reads as a fault.
fn whole_sentences(d: &str, limit: usize) -> String {
    if d.chars().count() + 1 < limit {
        return d.to_string();
    }
    parse::trim_to_sentences(d, limit).unwrap_or_else(|| format!("{}…", d.trim_end()))
}

/// The longest diagnosis the grammar lets the embedded reflector write: the prompts ask for one or two sentences.
const DIAGNOSIS_MAX_CHARS: u32 = 300;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::tests::run;
    use async_trait::async_trait;
    use sha2::{Digest, Sha256};
    use std::sync::Mutex;
    use tooltune_llm::ChatResponse;

    /// A scripted fake reflector for the retry logic: returns the given replies in order and records the
    /// conversations it was sent. Not a model; used only in these unit tests.
    struct ScriptedFakeReflector {
        replies: Mutex<Vec<Result<String, String>>>,
        seen: Mutex<Vec<ChatRequest>>,
    }

    impl ScriptedFakeReflector {
        fn new(replies: &[Result<&str, &str>]) -> Self {
            ScriptedFakeReflector {
                replies: Mutex::new(
                    replies
                        .iter()
                        .rev()
                        .map(|r| r.map(str::to_string).map_err(str::to_string))
                        .collect(),
                ),
                seen: Mutex::new(Vec::new()),
            }
        }
    }

    #[async_trait]
    impl ChatModel for ScriptedFakeReflector {
        fn id(&self) -> String {
            "fake:scripted".into()
        }
        async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
            self.seen.lock().expect("lock").push(req.clone());
            let next = self
                .replies
                .lock()
                .expect("lock")
                .pop()
                .expect("script has a reply left");
            match next {
                Ok(text) => Ok(ChatResponse {
                    content: Some(text),
                    tool_calls: vec![],
                    usage: Usage {
                        prompt_tokens: 100,
                        completion_tokens: 10,
                    },
                    finish_reason: FinishReason::Stop,
                }),
                Err(e) => Err(LlmError::InvalidRequest(e)),
            }
        }
        fn usage_total(&self) -> Usage {
            Usage::default()
        }
    }

    /// Reflects on `request(goal)` with a fake scripted to give `replies`; returns the fake (for what it was
    /// sent) and the proposal.
    async fn scripted(
        replies: &[Result<&str, &str>],
        goal: Goal,
    ) -> (ScriptedFakeReflector, Proposal) {
        let m = ScriptedFakeReflector::new(replies);
        let p = reflect(&m, &request(goal)).await.expect("reflects");
        (m, p)
    }

    fn request(goal: Goal) -> ReflectionRequest {
        ReflectionRequest {
            target: None,
            tool: "search_docs".into(),
            current_description: "Search the company's internal documentation.".into(),
            input_schema: Value::Null,
            goal,
            examples: vec![
                run(
                    "billing SDK retries",
                    "search_docs",
                    Some("web_search"),
                    false,
                ),
                run("World Cup winner", "web_search", Some("search_docs"), false),
            ],
            options: ReflectionOptions::default(),
        }
    }

    #[test]
    fn a_competitors_rewrite_under_selection_is_about_the_target() {
        // `web_search` rewritten so that `search_docs` is chosen: the goal sentence names the target, and a run
        // counts as failed when the target was not chosen first (the run where web_search was, run 1).
        let req = ReflectionRequest {
            tool: "web_search".into(),
            target: Some("search_docs".into()),
            ..request(Goal::Selection)
        };
        assert_eq!(req.goal_tool(), "search_docs");
        let failed: Vec<bool> = req.records().iter().map(|r| r.failed).collect();
        assert_eq!(failed, [true, false], "{:?}", req.records());
        let user = req.render().expect("renders").user;
        assert!(
            user.contains("Goal: the agent should choose `search_docs` as often as possible."),
            "{user}"
        );
        assert!(
            user.contains("Rewrite the description of the tool `web_search`"),
            "{user}"
        );
        // Under task success the target plays no part.
        let req = ReflectionRequest {
            goal: Goal::TaskSuccess,
            ..req
        };
        assert_eq!(req.goal_tool(), "web_search");
    }

    #[tokio::test]
    async fn a_good_first_reply_is_accepted() {
        let (m, p) = scripted(
            &[Ok(
                "DIAGNOSIS: vague.\nDESCRIPTION: Search the billing SDK reference.",
            )],
            Goal::TaskSuccess,
        )
        .await;
        assert_eq!(
            p.description.as_deref(),
            Some("Search the billing SDK reference.")
        );
        assert_eq!(p.diagnosis.as_deref(), Some("vague."));
        assert_eq!(p.attempts.len(), 1);
        assert_eq!(p.attempts[0].error, None);
        assert_eq!(p.shown, vec![0, 1]);
        assert_eq!(p.total_tokens(), 110);
        assert_eq!(p.template_version, TEMPLATE_VERSION);
        assert_eq!(p.model, "fake:scripted");
        let seen = m.seen.lock().expect("lock");
        assert_eq!(seen[0].messages.len(), 2, "system and user");
        // The reply's format goes with the request, and the token limit leaves room for it whole.
        let format = reply_format(false, 400);
        assert_eq!(
            (seen[0].temperature, seen[0].seed, seen[0].max_tokens),
            (0.0, Some(1), format.max_tokens())
        );
        assert!(format.max_tokens() > 180);
        assert_eq!(seen[0].format.as_ref(), Some(&format));
    }

    #[tokio::test]
    async fn bad_replies_are_retried_with_the_fault_named_then_recorded_as_a_failure() {
        let (m, p) = scripted(&[
            Ok("Certainly, I'd be happy to help!"),
            Ok("DIAGNOSIS: it lost.\nDESCRIPTION: Search the company's internal documentation."),
            Ok("DESCRIPTION: Certainly! Here it is."),
        ], Goal::Selection).await;
        assert!(!p.succeeded());
        assert_eq!(p.description, None);
        assert_eq!(p.diagnosis.as_deref(), Some("it lost."));
        assert_eq!(p.attempts.len(), 3);
        assert_eq!(p.attempts[0].rejection, Some(Rejection::NoDescription));
        assert_eq!(p.attempts[1].rejection, Some(Rejection::Unchanged));
        assert!(matches!(
            p.attempts[2].rejection,
            Some(Rejection::ChatReply { .. })
        ));
        assert!(
            p.attempts[0]
                .prompt
                .contains("Goal: the agent should choose `search_docs` as often as possible.")
        );
        let note = "A previous reply to this request could not be used: it has no line starting with DESCRIPTION:.";
        assert!(p.attempts[1].prompt.starts_with(&p.attempts[0].prompt));
        assert!(
            p.attempts[1].prompt.contains(note),
            "{}",
            p.attempts[1].prompt
        );
        assert!(
            p.attempts[2]
                .prompt
                .contains("the current description unchanged; write a different one.")
        );
        assert_eq!(p.tokens.prompt_tokens, 300);
        // Each retry is a fresh two-message conversation, sampled with its own seed.
        let seen = m.seen.lock().expect("lock");
        assert!(seen.iter().all(|r| r.messages.len() == 2));
        let knobs: Vec<(f32, Option<u64>)> = seen.iter().map(|r| (r.temperature, r.seed)).collect();
        assert_eq!(knobs, vec![(0.0, Some(1)), (0.7, Some(2)), (0.7, Some(3))]);
        assert!(
            matches!(&seen[1].messages[1], Message::User { content } if content == &p.attempts[1].prompt)
        );
        // Everything round-trips through JSON for the store.
        let back: Proposal =
            serde_json::from_str(&serde_json::to_string(&p).expect("serialises")).expect("parses");
        assert_eq!(back, p);
    }

    #[tokio::test]
    async fn a_reply_that_only_diagnosed_is_asked_for_the_description_in_the_same_conversation() {
        let diagnosis_only = "DIAGNOSIS: the agent could not tell internal documents from the web.";
        let (m, p) = scripted(
            &[
                Ok(diagnosis_only),
                Ok("DESCRIPTION: Search Quillmark's internal handbook, runbooks and SDK notes."),
            ],
            Goal::TaskSuccess,
        )
        .await;
        assert_eq!(
            p.description.as_deref(),
            Some("Search Quillmark's internal handbook, runbooks and SDK notes.")
        );
        assert_eq!(
            p.diagnosis.as_deref(),
            Some("the agent could not tell internal documents from the web.")
        );
        assert_eq!(p.attempts.len(), 2);
        assert_eq!(p.attempts[0].rejection, Some(Rejection::NoDescription));
        assert_eq!(p.attempts[0].follow_up, None);
        // The second attempt is the same conversation, one exchange longer, asked greedily.
        assert_eq!(p.attempts[1].prompt, p.attempts[0].prompt);
        let follow_up = p.attempts[1].follow_up.as_deref().expect("a follow-up");
        assert!(
            follow_up.starts_with("Your reply has the DIAGNOSIS but no DESCRIPTION.")
                && follow_up.contains("(at most 400 characters)"),
            "{follow_up}"
        );
        let seen = m.seen.lock().expect("lock");
        assert_eq!(seen[1].messages.len(), 4);
        assert!(
            matches!(&seen[1].messages[1], Message::User { content } if content == &p.attempts[0].prompt)
        );
        assert!(
            matches!(&seen[1].messages[2], Message::Assistant { content: Some(c), .. } if c == diagnosis_only)
        );
        assert!(matches!(&seen[1].messages[3], Message::User { content } if content == follow_up));
        assert_eq!(seen[1].temperature, 0.0);
        // The follow-up asks for the description alone, and its format says so.
        assert_eq!(seen[1].format, Some(reply_format(true, 400)));
        assert_eq!(seen[1].format.as_ref().map(|f| f.fields.len()), Some(1));
        let back: Proposal =
            serde_json::from_str(&serde_json::to_string(&p).expect("serialises")).expect("parses");
        assert_eq!(back, p);
    }

    #[test]
    fn a_diagnosis_cut_at_the_limit_keeps_its_whole_sentences() {
        assert_eq!(whole_sentences("Short. Fine", 300), "Short. Fine");
        let first = format!(
            "The agent chose web_search{}.",
            " again and again".repeat(10)
        );
        let cut = format!("{first} It then{}", " went on".repeat(40));
        assert_eq!(whole_sentences(&cut, 300), first);
        let one = "word ".repeat(70);
        assert!(whole_sentences(one.trim(), 300).ends_with("word…"));
    }

    #[tokio::test]
    async fn a_follow_up_that_fails_too_starts_over_with_the_fault_named() {
        let (m, p) = scripted(
            &[
                Ok("DIAGNOSIS: too vague."),
                Ok("DIAGNOSIS: still too vague."),
                Ok("DIAGNOSIS: vague.\nDESCRIPTION: Search the internal handbook."),
            ],
            Goal::TaskSuccess,
        )
        .await;
        assert_eq!(
            p.description.as_deref(),
            Some("Search the internal handbook.")
        );
        assert!(p.attempts[1].follow_up.is_some());
        // Not a second follow-up: a fresh conversation with the note, sampled.
        assert_eq!(p.attempts[2].follow_up, None);
        assert!(
            p.attempts[2]
                .prompt
                .ends_with("it has no line starting with DESCRIPTION:.\nReply in exactly this form, with nothing else:\nDIAGNOSIS: <one or two sentences>\nDESCRIPTION: <the new description of search_docs as plain text, at most 400 characters>"),
            "{}",
            p.attempts[2].prompt
        );
        let seen = m.seen.lock().expect("lock");
        let shape: Vec<(usize, f32)> = seen
            .iter()
            .map(|r| (r.messages.len(), r.temperature))
            .collect();
        assert_eq!(shape, vec![(2, 0.0), (4, 0.0), (2, 0.7)]);
    }

    #[tokio::test]
    async fn a_backend_failure_keeps_the_attempts_made_so_far() {
        let m = ScriptedFakeReflector::new(&[Ok("no labels here"), Err("connection reset")]);
        let e = reflect(&m, &request(Goal::TaskSuccess))
            .await
            .expect_err("backend fails");
        match e {
            ReflectionError::Model {
                attempt, partial, ..
            } => {
                assert_eq!(attempt, 2);
                assert_eq!(partial.attempts.len(), 1);
                assert_eq!(partial.attempts[0].reply, "no labels here");
            }
            other => panic!("unexpected error {other}"),
        }
    }

    #[tokio::test]
    async fn unusable_requests_are_refused_before_any_model_call() {
        let m = ScriptedFakeReflector::new(&[]);
        let mut r = request(Goal::TaskSuccess);
        r.examples.clear();
        let e = reflect(&m, &r).await.expect_err("no examples");
        assert!(e.to_string().contains("examples"), "{e}");
        let mut r = request(Goal::TaskSuccess);
        r.options.max_attempts = 0;
        assert!(
            reflect(&m, &r)
                .await
                .expect_err("no attempts")
                .to_string()
                .contains("options.max_attempts")
        );
        assert!(m.seen.lock().expect("lock").is_empty());
    }

    /// Changing a template changes what every stored proposal was produced by: the version must move too.
    #[test]
    fn templates_match_their_version() {
        let mut h = Sha256::new();
        for t in [
            include_str!("../templates/system.jinja"),
            include_str!("../templates/reflect.jinja"),
            include_str!("../templates/scope.jinja"),
            include_str!("../templates/goal.jinja"),
            include_str!("../templates/retry.jinja"),
            include_str!("../templates/describe.jinja"),
        ] {
            h.update(t.as_bytes());
            h.update(b"\0");
        }
        let got = hex::encode(h.finalize());
        assert_eq!(
            (TEMPLATE_VERSION, got.as_str()),
            (
                "reflect-v8",
                "71875beef1f4e865f272f1e91508f5290a67b185c4540d56ba0da23a525c5d3c"
            ),
            "a template changed: bump TEMPLATE_VERSION and record the new hash here"
        );
    }
}
