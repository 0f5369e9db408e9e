//! Task suites: the TOML format (documented in docs/suite-format.md) and its loader; the pure checks
//! that score one rollout are in `check`.
//!
//! Loading is strict because a typo in a suite silently changes what is measured: unknown fields are
//! refused, every task needs at least one check, ids are unique, regexes compile, and an error names the
//! file, the line when the parser knows it, the task (id and 1-based index) and the field.

mod check;

use crate::EvalError;
use crate::mcp::{ProtocolPref, ServerSpec, Transport};
pub use check::numbers_in;
use regex::{Regex, RegexBuilder};
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tooltune_core::ToolSpec;

/// Step limit of a task that sets none and whose suite sets none.
pub const DEFAULT_MAX_STEPS: u32 = 8;

/// Which part of the data a task belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Seen by the optimiser (reflection reads these rollouts).
    Train,
    /// Used to accept or reject candidates (Pareto set).
    Validation,
    /// Held out for the final report.
    Test,
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Split::Train => "train",
            Split::Validation => "validation",
            Split::Test => "test",
        })
    }
}

/// Checks on the final answer. All that are set must pass.
#[derive(Debug, Clone)]
pub struct AnswerCheck {
    /// The answer, trimmed (and without one trailing period), equals this.
    pub exact: Option<String>,
    /// The regex matches somewhere in the answer (anchor it with `^...$` for the whole answer).
    pub regex: Option<Regex>,
    /// Some number in the answer equals this, within `tolerance` (`69,504` reads as 69504).
    pub number: Option<f64>,
    /// Absolute tolerance of `number`.
    pub tolerance: f64,
    /// Every one of these strings occurs in the answer.
    pub contains: Vec<String>,
    /// Compare text case-insensitively (default true).
    pub ignore_case: bool,
}

/// A tool call that solves (part of) a task, used to prove the task is solvable on its server.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceCall {
    /// The tool to call.
    pub tool: String,
    /// Its arguments.
    #[serde(default = "empty_object")]
    pub arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// One task of a suite.
#[derive(Debug, Clone)]
pub struct Task {
    /// Unique id within the suite.
    pub id: String,
    /// The user's request.
    pub prompt: String,
    /// Train, validation or test.
    pub split: Split,
    /// The tool this task belongs to (the one that should be chosen first), for selection rate and
    /// off-target counts; `None` for tasks that need no tool.
    pub owner: Option<String>,
    /// Checks on the final answer.
    pub answer: Option<AnswerCheck>,
    /// Tools that must be called.
    pub expect_tools: Vec<String>,
    /// Whether `expect_tools` must be called in the listed order (as a subsequence of the calls).
    pub expect_order: bool,
    /// Tools that must not be called.
    pub forbid_tools: Vec<String>,
    /// Most model turns the agent gets.
    pub max_steps: u32,
    /// Tool calls that solve the task; the last one's result contains the answer.
    pub reference: Vec<ReferenceCall>,
    /// Checks on the rollout's copy of the fixture after the rollout (suites with a `[fixture]` only).
    pub expect_files: Vec<FileCheck>,
    /// A command run in the rollout's copy of the fixture after the rollout; exit status 0 passes.
    pub expect_command: Option<CommandCheck>,
}

/// A check on one file of the rollout's copy of the fixture.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileCheck {
    /// Path relative to the copy's root (`${FIXTURE_DIR}`).
    pub path: String,
    /// Whether the file must exist (default true); `false` checks that it was removed or moved away.
    #[serde(default = "yes")]
    pub exists: bool,
    /// Strings the file must contain.
    #[serde(default)]
    pub contains: Vec<String>,
    /// Strings the file must not contain.
    #[serde(default)]
    pub lacks: Vec<String>,
    /// The file's whole content, compared with surrounding whitespace trimmed.
    pub equals: Option<String>,
}

fn yes() -> bool {
    true
}

/// A command that judges the rollout's copy of the fixture: run in the copy's folder with `FIXTURE_DIR` set,
/// exit status 0 passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandCheck {
    /// The program (`${SUITE_DIR}` and the other suite variables expanded).
    pub command: String,
    /// Its arguments (expanded likewise).
    pub args: Vec<String>,
    /// How long it may run.
    pub timeout: Duration,
}

/// The verdict of [`Task::check`] on one rollout.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckResult {
    /// Every check passed.
    pub success: bool,
    /// Fraction of check groups (answer, expected tools, forbidden tools) that passed, in [0, 1].
    pub score: f64,
    /// What passed and what failed, concretely enough for a reflection model to act on.
    pub feedback: String,
}

/// A loaded, validated suite.
#[derive(Debug, Clone)]
pub struct Suite {
    /// The suite file.
    pub path: PathBuf,
    /// Its folder (`${SUITE_DIR}`).
    pub dir: PathBuf,
    /// The suite's name (its `name` field, or the file name without extension).
    pub name: String,
    /// Free-text description.
    pub description: Option<String>,
    /// How to start or reach the server, with variables expanded.
    pub server: ServerSpec,
    /// The tools whose descriptions are being optimised.
    pub tools_under_study: Vec<String>,
    /// Tools the server offers that the agent must not see (e.g. ones that write files).
    pub hide_tools: Vec<String>,
    /// The tasks, in file order.
    pub tasks: Vec<Task>,
    /// The world every rollout starts from, copied fresh for each (`[fixture]`).
    pub fixture: Option<crate::fixture::Fixture>,
    /// A command run before every rollout, for state a fixture cannot hold (`[reset]`).
    pub reset: Option<crate::fixture::ResetCommand>,
    /// The host's system prompt for this suite (`[host] system_prompt`), when the suite measures descriptions
    /// under a host other than tooltune's default.
    pub system_prompt: Option<String>,
}

// ---------------------------------------------------------------------------------------------------
// Raw file format

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSuite {
    name: Option<String>,
    description: Option<String>,
    server: RawServer,
    tools_under_study: Vec<String>,
    #[serde(default)]
    hide_tools: Vec<String>,
    max_steps: Option<u32>,
    fixture: Option<RawFixture>,
    reset: Option<RawCommand>,
    host: Option<RawHost>,
    #[serde(default)]
    task: Vec<RawTask>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFixture {
    path: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCommand {
    command: String,
    #[serde(default)]
    args: Vec<String>,
    cwd: Option<String>,
    timeout_secs: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    system_prompt: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    pass_env: Vec<String>,
    cwd: Option<String>,
    url: Option<String>,
    bearer_token_env: Option<String>,
    protocol: Option<String>,
    connect_timeout_secs: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTask {
    id: String,
    prompt: String,
    split: Split,
    owner: Option<String>,
    answer: Option<RawAnswer>,
    #[serde(default)]
    expect_tools: Vec<String>,
    expect_order: Option<bool>,
    #[serde(default)]
    forbid_tools: Vec<String>,
    max_steps: Option<u32>,
    #[serde(default)]
    reference: Vec<ReferenceCall>,
    #[serde(default)]
    expect_file: Vec<FileCheck>,
    expect_command: Option<RawCommand>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAnswer {
    exact: Option<String>,
    regex: Option<String>,
    number: Option<f64>,
    tolerance: Option<f64>,
    contains: Option<OneOrMany>,
    ignore_case: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

// ---------------------------------------------------------------------------------------------------
// Loading

struct Ctx<'a> {
    file: &'a Path,
    ids: Vec<Option<String>>,
}

impl Ctx<'_> {
    fn task_label(&self, index: usize) -> String {
        match self.ids.get(index).cloned().flatten() {
            Some(id) if !id.is_empty() => format!("`{id}` (#{})", index + 1),
            _ => format!("#{}", index + 1),
        }
    }

    fn err(
        &self,
        task: Option<usize>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> EvalError {
        EvalError::Suite {
            file: self.file.to_path_buf(),
            line: None,
            task: task.map(|i| self.task_label(i)),
            field: Some(field.into()),
            message: message.into(),
        }
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

impl Suite {
    /// Loads and validates a suite file, expanding `${SUITE_DIR}`, `${TOOLTUNE_THIRD_PARTY}` and
    /// `${TOOLTUNE_BIN_DIR}` in the server section.
    pub fn load(path: impl AsRef<Path>) -> Result<Suite, EvalError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|error| EvalError::SuiteRead {
            file: path.to_path_buf(),
            error,
        })?;
        Suite::parse(path, &text)
    }

    /// Parses suite text as if read from `path` (which sets `${SUITE_DIR}` and names errors).
    pub fn parse(path: &Path, text: &str) -> Result<Suite, EvalError> {
        // First pass: plain TOML, for syntax errors and to learn the task ids, so that a later error in
        // task 7 can say "task `contractor-weather-porto` (#7)".
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| EvalError::Suite {
                file: path.to_path_buf(),
                line: e.span().map(|s| line_of(text, s.start)),
                task: None,
                field: None,
                message: e.message().trim().to_string(),
            })?;
        let ids = table
            .get("task")
            .and_then(|t| t.as_array())
            .map(|a| {
                a.iter()
                    .map(|t| t.get("id").and_then(|v| v.as_str()).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let ctx = Ctx { file: path, ids };

        let de = toml::Deserializer::parse(text).map_err(|e| EvalError::Suite {
            file: path.to_path_buf(),
            line: e.span().map(|s| line_of(text, s.start)),
            task: None,
            field: None,
            message: e.message().trim().to_string(),
        })?;
        let raw: RawSuite = serde_path_to_error::deserialize(de).map_err(|e| {
            let (task, field) = split_path(&e.path().to_string());
            EvalError::Suite {
                file: path.to_path_buf(),
                line: e.inner().span().map(|s| line_of(text, s.start)),
                task: task.map(|i| ctx.task_label(i)),
                field,
                message: e.inner().message().trim().to_string(),
            }
        })?;
        Suite::from_raw(path, raw, &ctx)
    }

    fn from_raw(path: &Path, raw: RawSuite, ctx: &Ctx) -> Result<Suite, EvalError> {
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| PathBuf::from("."));
        let dir = dir.canonicalize().unwrap_or(dir);
        let name = raw.name.clone().unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "suite".into())
        });
        if raw.tools_under_study.is_empty() {
            return Err(ctx.err(None, "tools_under_study", "lists no tool"));
        }
        let suite_max = raw.max_steps.unwrap_or(DEFAULT_MAX_STEPS);
        if suite_max == 0 {
            return Err(ctx.err(None, "max_steps", "must be at least 1"));
        }
        let fixture = match &raw.fixture {
            None => None,
            Some(f) => {
                let p = expand_vars(&f.path, &dir, false)
                    .map_err(|m| ctx.err(None, "fixture.path", m))?;
                let p = dir.join(p);
                if !p.exists() {
                    return Err(ctx.err(
                        None,
                        "fixture.path",
                        format!("{} does not exist", p.display()),
                    ));
                }
                Some(
                    crate::fixture::Fixture::load(p)
                        .map_err(|e| ctx.err(None, "fixture.path", e.to_string()))?,
                )
            }
        };
        let server = server_spec(&name, &raw.server, &dir, fixture.is_some(), ctx)?;
        if fixture.is_some() {
            match &server.transport {
                Transport::Http { .. } => {
                    return Err(ctx.err(
                        None,
                        "fixture",
                        "needs a `command` server (one started on each rollout's copy); a `url` server's state \
                         can be reset with [reset] instead",
                    ));
                }
                Transport::Stdio { .. } => {
                    if !serde_json::to_string(&server.transport)
                        .unwrap_or_default()
                        .contains(crate::fixture::FIXTURE_VAR)
                    {
                        return Err(ctx.err(
                            None,
                            "server",
                            "never names ${FIXTURE_DIR} (in command, args, env or cwd), so the server would not \
                             run on the rollout's copy of the fixture",
                        ));
                    }
                }
            }
        }
        let reset = match &raw.reset {
            None => None,
            Some(r) => {
                let (command, args, timeout) = build_command(r, &dir, "reset", 30.0, ctx)?;
                Some(crate::fixture::ResetCommand {
                    command,
                    args,
                    cwd: r
                        .cwd
                        .as_deref()
                        .map(|c| {
                            expand_vars(c, &dir, false)
                                .map(|c| dir.join(c))
                                .map_err(|m| ctx.err(None, "reset.cwd", m))
                        })
                        .transpose()?,
                    timeout,
                })
            }
        };
        let system_prompt = match raw.host.as_ref().and_then(|h| h.system_prompt.clone()) {
            Some(p) if p.trim().is_empty() => {
                return Err(ctx.err(None, "host.system_prompt", "is empty"));
            }
            other => other,
        };

        let mut seen = HashSet::new();
        let mut tasks = Vec::with_capacity(raw.task.len());
        for (i, t) in raw.task.into_iter().enumerate() {
            let task = build_task(i, t, suite_max, &dir, fixture.is_some(), ctx)?;
            if !seen.insert(task.id.clone()) {
                return Err(ctx.err(
                    Some(i),
                    "id",
                    format!("duplicate id `{}` (ids must be unique)", task.id),
                ));
            }
            tasks.push(task);
        }
        if tasks.is_empty() {
            return Err(ctx.err(None, "task", "the suite has no [[task]]"));
        }
        Ok(Suite {
            path: path.to_path_buf(),
            dir,
            name,
            description: raw.description,
            server,
            tools_under_study: raw.tools_under_study,
            hide_tools: raw.hide_tools,
            tasks,
            fixture,
            reset,
            system_prompt,
        })
    }

    /// Starts the suite's server for listing its tools (and, without a fixture, for every rollout). With a
    /// fixture it runs on a copy of its own, kept as long as the returned handle.
    pub async fn connect(&self) -> Result<crate::mcp::McpServer, EvalError> {
        match &self.fixture {
            None => crate::mcp::McpServer::connect(self.server.clone()).await,
            Some(f) => {
                let dir = f.materialise()?;
                let server = crate::mcp::McpServer::connect(crate::fixture::spec_for(
                    &self.server,
                    dir.path(),
                ))
                .await?;
                Ok(server.keeping(dir))
            }
        }
    }

    /// What makes a rollout of this suite reproducible besides the suite file: the fixture's content digest.
    pub fn world_digest(&self) -> String {
        self.fixture
            .as_ref()
            .map_or_else(String::new, |f| f.digest.clone())
    }

    /// The tasks of one split, in file order.
    pub fn split(&self, split: Split) -> impl Iterator<Item = &Task> {
        self.tasks.iter().filter(move |t| t.split == split)
    }

    /// A task by id.
    pub fn task(&self, id: &str) -> Option<&Task> {
        self.tasks.iter().find(|t| t.id == id)
    }

    /// The server's tool list without the hidden tools: what the agent may see.
    pub fn visible_tools(&self, tools: Vec<ToolSpec>) -> Vec<ToolSpec> {
        tools
            .into_iter()
            .filter(|t| !self.hide_tools.contains(&t.name))
            .collect()
    }

    /// Checks that every tool the suite names (tools under study, hidden tools, owners, expected,
    /// forbidden and reference tools) exists on the server, whose tool list is given.
    pub fn check_tool_names(&self, server_tools: &[ToolSpec]) -> Result<(), EvalError> {
        let have: HashSet<&str> = server_tools.iter().map(|t| t.name.as_str()).collect();
        let list = || {
            let mut v: Vec<&str> = have.iter().copied().collect();
            v.sort();
            v.join(", ")
        };
        let ctx = Ctx {
            file: &self.path,
            ids: self.tasks.iter().map(|t| Some(t.id.clone())).collect(),
        };
        for (field, names) in [
            ("tools_under_study", &self.tools_under_study),
            ("hide_tools", &self.hide_tools),
        ] {
            for n in names {
                if !have.contains(n.as_str()) {
                    return Err(ctx.err(
                        None,
                        field,
                        format!("tool `{n}` is not offered by the server ({})", list()),
                    ));
                }
            }
        }
        for (i, t) in self.tasks.iter().enumerate() {
            let named = t
                .owner
                .iter()
                .map(|o| ("owner", o))
                .chain(t.expect_tools.iter().map(|n| ("expect_tools", n)))
                .chain(t.forbid_tools.iter().map(|n| ("forbid_tools", n)))
                .chain(t.reference.iter().map(|r| ("reference.tool", &r.tool)));
            for (field, n) in named {
                if !have.contains(n.as_str()) {
                    return Err(ctx.err(
                        Some(i),
                        field,
                        format!("tool `{n}` is not offered by the server ({})", list()),
                    ));
                }
                if self.hide_tools.contains(n) && field != "forbid_tools" {
                    return Err(ctx.err(
                        Some(i),
                        field,
                        format!("tool `{n}` is hidden from the agent (hide_tools)"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Splits a serde path such as `task[3].answer.regex` into the task index and the field inside it.
fn split_path(path: &str) -> (Option<usize>, Option<String>) {
    if let Some(rest) = path.strip_prefix("task[")
        && let Some(close) = rest.find(']')
        && let Ok(i) = rest[..close].parse::<usize>()
    {
        let field = rest[close + 1..].trim_start_matches('.');
        return (
            Some(i),
            if field.is_empty() {
                None
            } else {
                Some(field.to_string())
            },
        );
    }
    let field = if path.is_empty() || path == "." {
        None
    } else {
        Some(path.to_string())
    };
    (None, field)
}

fn server_spec(
    name: &str,
    raw: &RawServer,
    suite_dir: &Path,
    fixture: bool,
    ctx: &Ctx,
) -> Result<ServerSpec, EvalError> {
    let expand = |field: &str, s: &str| {
        expand_vars(s, suite_dir, fixture).map_err(|m| ctx.err(None, field, m))
    };
    let protocol = match &raw.protocol {
        None => ProtocolPref::Auto,
        Some(p) => ProtocolPref::parse(p).map_err(|m| ctx.err(None, "server.protocol", m))?,
    };
    let connect_timeout = match raw.connect_timeout_secs {
        None => Duration::from_secs(30),
        Some(s) if s.is_finite() && s > 0.0 => Duration::from_secs_f64(s),
        Some(s) => {
            return Err(ctx.err(
                None,
                "server.connect_timeout_secs",
                format!("{s} is not a positive number of seconds"),
            ));
        }
    };
    let transport = match (&raw.command, &raw.url) {
        (Some(_), Some(_)) => {
            return Err(ctx.err(
                None,
                "server",
                "give either `command` (stdio) or `url` (Streamable HTTP), not both",
            ));
        }
        (None, None) => {
            return Err(ctx.err(
                None,
                "server",
                "give `command` (stdio) or `url` (Streamable HTTP)",
            ));
        }
        (Some(command), None) => {
            if raw.bearer_token_env.is_some() {
                return Err(ctx.err(
                    None,
                    "server.bearer_token_env",
                    "applies to `url` servers only",
                ));
            }
            if command.trim().is_empty() {
                return Err(ctx.err(None, "server.command", "is empty"));
            }
            let mut env = BTreeMap::new();
            for (k, v) in &raw.env {
                env.insert(k.clone(), expand(&format!("server.env.{k}"), v)?);
            }
            let mut args = Vec::with_capacity(raw.args.len());
            for (i, a) in raw.args.iter().enumerate() {
                args.push(expand(&format!("server.args[{i}]"), a)?);
            }
            Transport::Stdio {
                command: expand("server.command", command)?,
                args,
                env,
                pass_env: raw.pass_env.clone(),
                cwd: raw
                    .cwd
                    .as_deref()
                    .map(|c| expand("server.cwd", c).map(PathBuf::from))
                    .transpose()?,
            }
        }
        (None, Some(url)) => {
            for (field, set) in [
                ("server.args", !raw.args.is_empty()),
                ("server.env", !raw.env.is_empty()),
                ("server.pass_env", !raw.pass_env.is_empty()),
                ("server.cwd", raw.cwd.is_some()),
            ] {
                if set {
                    return Err(ctx.err(None, field, "applies to `command` servers only"));
                }
            }
            let url = expand("server.url", url)?;
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(ctx.err(
                    None,
                    "server.url",
                    format!("{url:?} is not an http:// or https:// URL"),
                ));
            }
            Transport::Http {
                url,
                bearer_token_env: raw.bearer_token_env.clone(),
            }
        }
    };
    Ok(ServerSpec {
        name: name.to_string(),
        transport,
        protocol,
        connect_timeout,
    })
}

/// The directory holding tooltune's binaries (and the example servers built beside them):
/// `TOOLTUNE_BIN_DIR` when set, else the running executable's folder (leaving cargo's `deps/`).
pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TOOLTUNE_BIN_DIR") {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    dir
}

/// Where `datasets/setup.sh` installs third-party servers for suites in `suite_dir`:
/// `TOOLTUNE_THIRD_PARTY` when set, else `.third-party` beside the suite folder.
pub fn third_party_dir(suite_dir: &Path) -> PathBuf {
    match std::env::var_os("TOOLTUNE_THIRD_PARTY") {
        Some(d) => PathBuf::from(d),
        None => suite_dir.join("..").join(".third-party"),
    }
}

/// Expands `${SUITE_DIR}`, `${TOOLTUNE_THIRD_PARTY}` and `${TOOLTUNE_BIN_DIR}`; `${FIXTURE_DIR}` stays as it is
/// when `fixture` (it names each rollout's copy, known only then); any other `${...}` is an error, so that a
/// suite cannot quietly read the host's environment.
fn expand_vars(s: &str, suite_dir: &Path, fixture: bool) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(format!("unclosed `${{` in {s:?}"));
        };
        let var = &after[..end];
        let value = match var {
            "SUITE_DIR" => suite_dir.to_path_buf(),
            "TOOLTUNE_THIRD_PARTY" => third_party_dir(suite_dir),
            "TOOLTUNE_BIN_DIR" => bin_dir(),
            "FIXTURE_DIR" if fixture => PathBuf::from(crate::fixture::FIXTURE_VAR),
            "FIXTURE_DIR" => {
                return Err(
                    "`${FIXTURE_DIR}` needs a [fixture] section (the folder copied for each rollout)"
                        .into(),
                );
            }
            other => {
                return Err(format!(
                    "unknown variable `${{{other}}}`; known: ${{SUITE_DIR}}, ${{TOOLTUNE_THIRD_PARTY}}, ${{TOOLTUNE_BIN_DIR}} (use server.pass_env to pass a host variable to the server)"
                ));
            }
        };
        out.push_str(&value.to_string_lossy());
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A command section's program, expanded arguments and timeout.
fn build_command(
    r: &RawCommand,
    dir: &Path,
    field: &str,
    default_timeout: f64,
    ctx: &Ctx,
) -> Result<(String, Vec<String>, Duration), EvalError> {
    if r.command.trim().is_empty() {
        return Err(ctx.err(None, format!("{field}.command"), "is empty"));
    }
    let command = expand_vars(&r.command, dir, false)
        .map_err(|m| ctx.err(None, format!("{field}.command"), m))?;
    let mut args = Vec::with_capacity(r.args.len());
    for (i, a) in r.args.iter().enumerate() {
        args.push(
            expand_vars(a, dir, false)
                .map_err(|m| ctx.err(None, format!("{field}.args[{i}]"), m))?,
        );
    }
    let secs = r.timeout_secs.unwrap_or(default_timeout);
    if !(secs.is_finite() && secs > 0.0) {
        return Err(ctx.err(
            None,
            format!("{field}.timeout_secs"),
            format!("{secs} is not a positive number of seconds"),
        ));
    }
    Ok((command, args, Duration::from_secs_f64(secs)))
}

fn build_task(
    i: usize,
    t: RawTask,
    suite_max: u32,
    dir: &Path,
    fixture: bool,
    ctx: &Ctx,
) -> Result<Task, EvalError> {
    let e = |field: &str, msg: String| ctx.err(Some(i), field, msg);
    if t.id.trim().is_empty() {
        return Err(e("id", "is empty".into()));
    }
    if t.id.chars().any(char::is_whitespace) {
        return Err(e("id", format!("{:?} contains whitespace", t.id)));
    }
    if t.prompt.trim().is_empty() {
        return Err(e("prompt", "is empty".into()));
    }
    let max_steps = t.max_steps.unwrap_or(suite_max);
    if max_steps == 0 {
        return Err(e("max_steps", "must be at least 1".into()));
    }
    let answer = match t.answer {
        None => None,
        Some(a) => Some(build_answer(a, &e)?),
    };
    if !fixture && (!t.expect_file.is_empty() || t.expect_command.is_some()) {
        let field = if t.expect_file.is_empty() {
            "expect_command"
        } else {
            "expect_file"
        };
        return Err(e(
            field,
            "checks the fixture after the rollout, but the suite has no [fixture]".into(),
        ));
    }
    for (j, f) in t.expect_file.iter().enumerate() {
        let p = Path::new(&f.path);
        if f.path.trim().is_empty()
            || p.is_absolute()
            || p.components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(e(
                &format!("expect_file[{j}].path"),
                format!(
                    "{:?} must be a path inside the fixture (relative, without `..`)",
                    f.path
                ),
            ));
        }
        if !f.exists && (!f.contains.is_empty() || !f.lacks.is_empty() || f.equals.is_some()) {
            return Err(e(
                &format!("expect_file[{j}]"),
                "`exists = false` cannot be combined with content checks".into(),
            ));
        }
    }
    let expect_command = match &t.expect_command {
        None => None,
        Some(c) => {
            let (command, args, timeout) = build_command(c, dir, "expect_command", 30.0, ctx)
                .map_err(|err| match err {
                    EvalError::Suite {
                        file,
                        line,
                        field,
                        message,
                        ..
                    } => EvalError::Suite {
                        file,
                        line,
                        task: Some(ctx.task_label(i)),
                        field,
                        message,
                    },
                    other => other,
                })?;
            if c.cwd.is_some() {
                return Err(e(
                    "expect_command.cwd",
                    "is always the rollout's copy of the fixture".into(),
                ));
            }
            Some(CommandCheck {
                command,
                args,
                timeout,
            })
        }
    };
    if answer.is_none()
        && t.expect_tools.is_empty()
        && t.forbid_tools.is_empty()
        && t.expect_file.is_empty()
        && expect_command.is_none()
    {
        return Err(e(
            "answer",
            "the task has no check: give `answer.*`, `expect_tools`, `forbid_tools`, `expect_file` or \
             `expect_command`"
                .into(),
        ));
    }
    for n in &t.expect_tools {
        if t.forbid_tools.contains(n) {
            return Err(e(
                "forbid_tools",
                format!("tool `{n}` is both expected and forbidden"),
            ));
        }
    }
    if let Some(o) = &t.owner
        && t.forbid_tools.contains(o)
    {
        return Err(e(
            "owner",
            format!("the owner `{o}` is also in forbid_tools"),
        ));
    }
    for (j, r) in t.reference.iter().enumerate() {
        if !r.arguments.is_object() {
            return Err(e(
                &format!("reference[{j}].arguments"),
                "must be a table".into(),
            ));
        }
    }
    Ok(Task {
        id: t.id,
        prompt: t.prompt,
        split: t.split,
        owner: t.owner,
        answer,
        expect_tools: t.expect_tools,
        expect_order: t.expect_order.unwrap_or(true),
        forbid_tools: t.forbid_tools,
        max_steps,
        reference: t.reference,
        expect_files: t.expect_file,
        expect_command,
    })
}

fn build_answer(
    a: RawAnswer,
    e: &impl Fn(&str, String) -> EvalError,
) -> Result<AnswerCheck, EvalError> {
    let ignore_case = a.ignore_case.unwrap_or(true);
    let regex = match &a.regex {
        None => None,
        Some(r) => Some(
            RegexBuilder::new(r)
                .case_insensitive(ignore_case)
                .build()
                .map_err(|err| e("answer.regex", format!("does not compile: {err}")))?,
        ),
    };
    if let Some(n) = a.number
        && !n.is_finite()
    {
        return Err(e("answer.number", format!("{n} is not a finite number")));
    }
    let tolerance = a.tolerance.unwrap_or(0.0);
    if !(tolerance.is_finite() && tolerance >= 0.0) {
        return Err(e(
            "answer.tolerance",
            format!("{tolerance} is not a non-negative number"),
        ));
    }
    if a.tolerance.is_some() && a.number.is_none() {
        return Err(e(
            "answer.tolerance",
            "applies to `answer.number`, which is not set".into(),
        ));
    }
    let contains = match a.contains {
        None => Vec::new(),
        Some(OneOrMany::One(s)) => vec![s],
        Some(OneOrMany::Many(v)) => v,
    };
    if contains.iter().any(|s| s.is_empty()) {
        return Err(e("answer.contains", "holds an empty string".into()));
    }
    if let Some(x) = &a.exact
        && x.trim().is_empty()
    {
        return Err(e("answer.exact", "is empty".into()));
    }
    let check = AnswerCheck {
        exact: a.exact,
        regex,
        number: a.number,
        tolerance,
        contains,
        ignore_case,
    };
    if check.is_empty() {
        return Err(e(
            "answer",
            "sets no check: give exact, regex, number or contains".into(),
        ));
    }
    Ok(check)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "demo"
tools_under_study = ["read_file"]

[server]
command = "${SUITE_DIR}/srv"
args = ["--data", "${SUITE_DIR}/data"]
env = { LANG = "C" }
protocol = "2026-07-28"

[[task]]
id = "notes-sum"
prompt = "Read notes.txt and sum the numbers in it."
split = "train"
owner = "read_file"
answer.number = 69504
expect_tools = ["read_file", "calculator"]

[[task]]
id = "who"
prompt = "Who is the treasurer?"
split = "test"
owner = "read_file"
answer.contains = "Joon Lee"
forbid_tools = ["calculator"]
max_steps = 3
"#;

    fn parse(text: &str) -> Result<Suite, EvalError> {
        Suite::parse(Path::new("suites/demo.toml"), text)
    }

    fn err_text(text: &str) -> String {
        parse(text).expect_err("should fail").to_string()
    }

    #[test]
    fn loads_a_good_suite_and_expands_variables() {
        let s = parse(GOOD).expect("good suite");
        assert_eq!(s.name, "demo");
        assert_eq!(s.tasks.len(), 2);
        assert_eq!(s.tasks[0].max_steps, DEFAULT_MAX_STEPS);
        assert_eq!(s.tasks[1].max_steps, 3);
        assert!(s.tasks[0].expect_order);
        assert_eq!(s.split(Split::Test).count(), 1);
        assert_eq!(
            s.server.protocol,
            ProtocolPref::Version("2026-07-28".into())
        );
        match &s.server.transport {
            Transport::Stdio {
                command, args, env, ..
            } => {
                assert!(
                    command.ends_with("/srv") && !command.contains("${"),
                    "{command}"
                );
                assert!(args[1].ends_with("/data"), "{args:?}");
                assert_eq!(env.get("LANG").map(String::as_str), Some("C"));
            }
            other => panic!("expected stdio, got {other:?}"),
        }
    }

    #[test]
    fn syntax_errors_name_file_and_line() {
        let e = err_text("tools_under_study = [\"a\"]\n[server\ncommand = 1\n");
        assert!(e.starts_with("suites/demo.toml:2: "), "{e}");
    }

    #[test]
    fn unknown_field_names_task_and_field() {
        let bad = GOOD.replace(
            "answer.contains = \"Joon Lee\"",
            "answr.contains = \"Joon Lee\"",
        );
        let e = err_text(&bad);
        assert!(e.contains("suites/demo.toml:"), "{e}");
        assert!(e.contains("task `who` (#2)"), "{e}");
        assert!(e.contains("answr"), "{e}");
    }

    #[test]
    fn wrong_type_names_the_field_path() {
        let bad = GOOD.replace("answer.number = 69504", "answer.number = \"lots\"");
        let e = err_text(&bad);
        assert!(e.contains("task `notes-sum` (#1)"), "{e}");
        assert!(e.contains("field `answer.number`"), "{e}");
    }

    #[test]
    fn unknown_split_is_refused() {
        let e = err_text(&GOOD.replace("split = \"test\"", "split = \"dev\""));
        assert!(
            e.contains("task `who` (#2)") && e.contains("field `split`"),
            "{e}"
        );
        assert!(e.contains("dev"), "{e}");
    }

    #[test]
    fn bad_regex_is_refused_with_its_field() {
        let bad = GOOD.replace(
            "answer.contains = \"Joon Lee\"",
            "answer.regex = \"(unclosed\"",
        );
        let e = err_text(&bad);
        assert!(
            e.contains("task `who` (#2): field `answer.regex`: does not compile"),
            "{e}"
        );
    }

    #[test]
    fn duplicate_ids_and_checkless_tasks_are_refused() {
        let e = err_text(&GOOD.replace("id = \"who\"", "id = \"notes-sum\""));
        assert!(e.contains("field `id`: duplicate id `notes-sum`"), "{e}");
        let bad = GOOD
            .replace("answer.contains = \"Joon Lee\"\n", "")
            .replace("forbid_tools = [\"calculator\"]\n", "");
        let e = err_text(&bad);
        assert!(
            e.contains("task `who` (#2)") && e.contains("has no check"),
            "{e}"
        );
    }

    #[test]
    fn server_section_is_validated() {
        let e = err_text(&GOOD.replace("protocol = \"2026-07-28\"", "protocol = \"2027-01-01\""));
        assert!(e.contains("field `server.protocol`"), "{e}");
        let e = err_text(&GOOD.replace("${SUITE_DIR}/srv", "${HOME}/srv"));
        assert!(
            e.contains("field `server.command`") && e.contains("${HOME}"),
            "{e}"
        );
        let e = err_text(&GOOD.replace(
            "command = \"${SUITE_DIR}/srv\"",
            "command = \"x\"\nurl = \"http://127.0.0.1:1/mcp\"",
        ));
        assert!(e.contains("not both"), "{e}");
    }

    #[test]
    fn check_scores_answer_and_tools() {
        let s = parse(GOOD).expect("good");
        let t = &s.tasks[0];
        let r = t.check(Some("The total is 69,504."), &["read_file", "calculator"]);
        assert!(r.success, "{r:?}");
        assert_eq!(r.score, 1.0);

        let r = t.check(Some("The total is 69494."), &["read_file"]);
        assert!(!r.success);
        assert_eq!(r.score, 0.0);
        assert!(
            r.feedback.contains("the answer's numbers are 69494"),
            "{}",
            r.feedback
        );
        assert!(r.feedback.contains("calculator was not"), "{}", r.feedback);

        let r = t.check(Some("69504"), &["calculator", "read_file"]);
        assert!(!r.success);
        assert_eq!(r.score, 0.5);
        assert!(r.feedback.contains("in this order"), "{}", r.feedback);

        let r = t.check::<&str>(None, &[]);
        assert!(
            !r.success && r.feedback.contains("no final answer"),
            "{r:?}"
        );

        let who = &s.tasks[1];
        assert!(who.check(Some("It is joon lee."), &["read_file"]).success);
        let r = who.check(Some("Joon Lee"), &["read_file", "calculator"]);
        assert!(
            !r.success && r.feedback.contains("must not be used"),
            "{r:?}"
        );
    }

    #[test]
    fn numbers_are_read_like_a_person_would() {
        assert_eq!(numbers_in("69,504 total"), vec![69504.0]);
        assert_eq!(numbers_in("4, 48000 and 9500"), vec![4.0, 48000.0, 9500.0]);
        assert_eq!(numbers_in("on 2026-09-01"), vec![2026.0, 9.0, 1.0]);
        assert_eq!(numbers_in("it is -3.5 or 0.875"), vec![-3.5, 0.875]);
        assert_eq!(numbers_in("code QM-4092 in v2"), vec![4092.0]);
        assert_eq!(numbers_in("2:21:47"), vec![2.0, 21.0, 47.0]);
        assert_eq!(numbers_in("1,2345"), vec![1.0, 2345.0]);
    }

    #[test]
    fn exact_regex_and_found_in() {
        let a = AnswerCheck {
            exact: Some("Hanbit Hall".into()),
            regex: None,
            number: None,
            tolerance: 0.0,
            contains: vec![],
            ignore_case: true,
        };
        assert!(a.failures("hanbit hall.").is_empty());
        assert!(!a.failures("It is Hanbit Hall").is_empty());
        assert!(a.found_in("Last year's venue: Hanbit Hall"));
        let n = AnswerCheck {
            exact: None,
            regex: Some(Regex::new(r"\b0?5:30\b").expect("regex")),
            number: Some(7.0),
            tolerance: 0.0,
            contains: vec![],
            ignore_case: false,
        };
        assert!(n.found_in("retries 7 times, at 05:30"));
        assert!(!n.found_in("retries 17 times, at 05:30"));
    }

    /// A suite file with a fixture folder beside it, in a temporary folder.
    fn with_fixture(
        server: &str,
        extra: &str,
        task_checks: &str,
    ) -> (tempfile::TempDir, Result<Suite, EvalError>) {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir_all(dir.path().join("world")).expect("mkdir");
        std::fs::write(dir.path().join("world/a.txt"), "a").expect("write");
        let text = format!(
            "tools_under_study = [\"t\"]\n{extra}\n[server]\n{server}\n\n[[task]]\nid = \"x\"\nprompt = \"p\"\n\
             split = \"test\"\n{task_checks}\n"
        );
        let path = dir.path().join("s.toml");
        std::fs::write(&path, &text).expect("write");
        let r = Suite::load(&path);
        (dir, r)
    }

    #[test]
    fn a_fixture_suite_keeps_the_fixture_variable_for_each_rollout_and_checks_files() {
        let (dir, r) = with_fixture(
            "command = \"srv\"\nargs = [\"--root\", \"${FIXTURE_DIR}\"]",
            "[fixture]\npath = \"world\"\n[host]\nsystem_prompt = \"Be brief.\"",
            "expect_file = [{ path = \"a.txt\", contains = [\"a\"] }, { path = \"gone.txt\", exists = false }]",
        );
        let s = r.unwrap_or_else(|e| panic!("{e}"));
        let f = s.fixture.as_ref().expect("fixture");
        assert!(f.source.ends_with("world"));
        assert_eq!(
            f.digest,
            crate::fixture::digest(&dir.path().join("world")).expect("digest")
        );
        assert_eq!(s.world_digest(), f.digest);
        assert_eq!(s.system_prompt.as_deref(), Some("Be brief."));
        let Transport::Stdio { args, .. } = &s.server.transport else {
            panic!("stdio")
        };
        assert_eq!(args[1], "${FIXTURE_DIR}");
        assert_eq!(s.tasks[0].expect_files.len(), 2);
        assert!(!s.tasks[0].expect_files[1].exists);
        // A world check is a check group of its own.
        let r = s.tasks[0].check_with_world(
            Some("ok"),
            &["t"],
            &[(true, "a".into()), (false, "b".into())],
        );
        assert!(!r.success);
        assert!((r.score - 0.5).abs() < 1e-12);
        assert!(r.feedback.contains('b'));
    }

    #[test]
    fn fixture_mistakes_are_named() {
        let cases = [
            // The variable without a fixture.
            (
                "command = \"srv\"\nargs = [\"${FIXTURE_DIR}\"]",
                "",
                "answer.contains = \"a\"",
                "needs a [fixture]",
            ),
            // A fixture the server never uses.
            (
                "command = \"srv\"",
                "[fixture]\npath = \"world\"",
                "answer.contains = \"a\"",
                "never names ${FIXTURE_DIR}",
            ),
            // A fixture for a URL server.
            (
                "url = \"http://127.0.0.1:1/mcp\"",
                "[fixture]\npath = \"world\"",
                "answer.contains = \"a\"",
                "needs a `command` server",
            ),
            // A missing fixture.
            (
                "command = \"${FIXTURE_DIR}/srv\"",
                "[fixture]\npath = \"nowhere\"",
                "answer.contains = \"a\"",
                "does not exist",
            ),
            // File checks without a fixture.
            (
                "command = \"srv\"",
                "",
                "expect_file = [{ path = \"a.txt\" }]",
                "has no [fixture]",
            ),
            // A path out of the fixture.
            (
                "command = \"${FIXTURE_DIR}/srv\"",
                "[fixture]\npath = \"world\"",
                "expect_file = [{ path = \"../etc/passwd\" }]",
                "inside the fixture",
            ),
            // Content checks on a file that must be gone.
            (
                "command = \"${FIXTURE_DIR}/srv\"",
                "[fixture]\npath = \"world\"",
                "expect_file = [{ path = \"a.txt\", exists = false, contains = [\"a\"] }]",
                "cannot be combined",
            ),
            // A reset command with a bad timeout.
            (
                "command = \"srv\"",
                "[reset]\ncommand = \"true\"\ntimeout_secs = 0",
                "answer.contains = \"a\"",
                "reset.timeout_secs",
            ),
            // An empty host prompt.
            (
                "command = \"srv\"",
                "[host]\nsystem_prompt = \" \"",
                "answer.contains = \"a\"",
                "host.system_prompt",
            ),
        ];
        for (server, extra, checks, want) in cases {
            let (_dir, r) = with_fixture(server, extra, checks);
            let msg = r.expect_err(want).to_string();
            assert!(msg.contains(want), "{want:?} not in {msg:?}");
            assert!(msg.contains("s.toml"), "{msg}");
        }
    }
}
