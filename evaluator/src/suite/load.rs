//! The suite loader: the TOML file's raw shape, its validation into a [`Suite`], the `[server]` and command
//! sections, and the check of a suite's tool names against its server; each `[[task]]` is built in `task`.
//!
//! Loading is strict because a typo in a suite silently changes what is measured: unknown fields are
//! refused, every task needs at least one check, ids are unique, regexes compile, and an error names the
//! file, the line when the parser knows it, the task (id and 1-based index) and the field.

mod task;

use super::paths::expand_vars;
use super::{DEFAULT_MAX_STEPS, FileCheck, ReferenceCall, Split, Suite};
use crate::EvalError;
use crate::mcp::{CatalogTool, ProtocolPref, ServerSpec, Transport};
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;
use task::build_task;
use tooltune_core::ToolSpec;

// ---------------------------------------------------------------------------------------------------
// Raw file format

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSuite {
    name: Option<String>,
    description: Option<String>,
    server: Option<RawServer>,
    // A catalog suite declares its tools instead of a server: inline, or in a file in the `tools/list` shape.
    #[serde(default)]
    tool: Vec<RawTool>,
    tools: Option<String>,
    // Required for a server suite; a catalog suite studies every declared tool unless it says otherwise.
    #[serde(default)]
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
struct RawTool {
    name: String,
    description: Option<String>,
    #[serde(alias = "inputSchema")]
    input_schema: Option<serde_json::Value>,
    annotations: Option<serde_json::Value>,
}

/// One tool of a `tools = "FILE.json"` catalog, as a server's `tools/list` result writes it. Other members a
/// server may send (`title`, `outputSchema`, `_meta`, `icons`) are read past: the file is often a server's own
/// output, saved as it came.
#[derive(Debug, Deserialize)]
struct ListedTool {
    name: String,
    description: Option<String>,
    #[serde(rename = "inputSchema", alias = "input_schema")]
    input_schema: Option<serde_json::Value>,
    annotations: Option<serde_json::Value>,
}

/// A `tools = "FILE.json"` file: a `tools/list` result (`{"tools": [...]}`) or the bare array.
enum ListedTools {
    Result { tools: Vec<ListedTool> },
    Bare(Vec<ListedTool>),
}

#[derive(Debug, Deserialize)]
struct ToolsResult {
    tools: Vec<ListedTool>,
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
    provenance: Option<super::Provenance>,
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

/// The 1-based line of each `[[task]]` header of a suite's text, in file order (the n-th entry is the n-th task), so
/// a report on a loaded task can name its place in the file. Headers inside multi-line strings are not told apart;
/// the bundled suites and drafted ones have none.
pub fn task_lines(text: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.trim_start().starts_with("[[task]]"))
        .map(|(i, _)| i + 1)
        .collect()
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
        let syntax = |e: toml::de::Error| EvalError::Suite {
            file: path.to_path_buf(),
            line: e.span().map(|s| line_of(text, s.start)),
            task: None,
            field: None,
            message: e.message().trim().to_string(),
        };
        let table: toml::Table = text.parse().map_err(syntax)?;
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

        let de = toml::Deserializer::parse(text).map_err(syntax)?;
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
        let catalog = catalog_tools(&raw, &dir, ctx)?;
        if catalog.is_none() && raw.server.is_none() {
            return Err(ctx.err(
                None,
                "server",
                "missing: give [server] (the command that starts the MCP server, or its `url`), or declare the tools \
                 for a catalog suite ([[tool]] entries or `tools = \"FILE.json\"`)",
            ));
        }
        let tools_under_study = match &catalog {
            Some(tools) if raw.tools_under_study.is_empty() => {
                tools.iter().map(|t| t.name.clone()).collect()
            }
            _ if raw.tools_under_study.is_empty() => {
                return Err(ctx.err(None, "tools_under_study", "lists no tool"));
            }
            _ => raw.tools_under_study.clone(),
        };
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
        let is_catalog = catalog.is_some();
        let server = match (&raw.server, catalog) {
            (Some(_), Some(_)) => {
                return Err(ctx.err(
                    None,
                    "server",
                    "give either [server] or the tools ([[tool]] entries or `tools = \"FILE.json\"`), not both",
                ));
            }
            // Refused above, before tools_under_study is read, so that error comes first.
            (None, None) => unreachable!("a suite with neither server nor tools is refused above"),
            (Some(s), None) => server_spec(&name, s, &dir, fixture.is_some(), ctx)?,
            (None, Some(tools)) => {
                if raw.fixture.is_some() || raw.reset.is_some() {
                    let field = if raw.fixture.is_some() {
                        "fixture"
                    } else {
                        "reset"
                    };
                    return Err(ctx.err(
                        None,
                        field,
                        "a catalog suite runs no server, so it has no world to prepare; remove the section",
                    ));
                }
                ServerSpec {
                    name: name.clone(),
                    transport: Transport::Catalog { tools },
                    protocol: ProtocolPref::Auto,
                    connect_timeout: Duration::from_secs(30),
                }
            }
        };
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
                // Refused above: a catalog suite has no fixture.
                Transport::Catalog { .. } => {}
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
            let task = build_task(i, t, suite_max, &dir, fixture.is_some(), is_catalog, ctx)?;
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
        let suite = Suite {
            path: path.to_path_buf(),
            dir,
            name,
            description: raw.description,
            server,
            tools_under_study,
            hide_tools: raw.hide_tools,
            tasks,
            fixture,
            reset,
            system_prompt,
        };
        // A catalog's tool list is known now: a wrong owner is reported when the file loads, not at evaluation.
        if let Transport::Catalog { tools } = &suite.server.transport {
            let listed: Vec<ToolSpec> = tools
                .iter()
                .map(|t| ToolSpec {
                    name: t.name.clone(),
                    description: t.description.clone(),
                    input_schema: std::sync::Arc::new(t.input_schema.clone()),
                })
                .collect();
            suite.check_tool_names(&listed)?;
        }
        Ok(suite)
    }
}

/// The tools a catalog suite declares (`[[tool]]` entries, or `tools = "FILE.json"`), validated: names present and
/// unique, schemas objects. `None` for a suite that declares none (a server suite).
fn catalog_tools(
    raw: &RawSuite,
    dir: &Path,
    ctx: &Ctx,
) -> Result<Option<Vec<CatalogTool>>, EvalError> {
    let declared: Vec<(String, RawTool)> = match (&raw.tools, raw.tool.is_empty()) {
        (None, true) => return Ok(None),
        (Some(_), false) => {
            return Err(ctx.err(
                None,
                "tools",
                "give the tools either inline ([[tool]]) or in a file (`tools = \"FILE.json\"`), not both",
            ));
        }
        (None, false) => raw
            .tool
            .iter()
            .enumerate()
            .map(|(i, t)| {
                (
                    format!("tool[{i}]"),
                    RawTool {
                        name: t.name.clone(),
                        description: t.description.clone(),
                        input_schema: t.input_schema.clone(),
                        annotations: t.annotations.clone(),
                    },
                )
            })
            .collect(),
        (Some(file), true) => {
            let rel = expand_vars(file, dir, false).map_err(|m| ctx.err(None, "tools", m))?;
            let p = dir.join(rel);
            let text = std::fs::read_to_string(&p).map_err(|e| {
                ctx.err(
                    None,
                    "tools",
                    format!("{}: cannot be read: {e}", p.display()),
                )
            })?;
            let shape = "a tools/list result (`{\"tools\": [{\"name\", \"description\", \"inputSchema\"}, ...]}`) \
                         or an array of such tools";
            let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
                ctx.err(
                    None,
                    "tools",
                    format!("{}:{}:{}: not JSON: {e}", p.display(), e.line(), e.column()),
                )
            })?;
            // Read through serde_path_to_error so that a wrong member is named by its path (`tools[3].name`).
            let listed: Result<ListedTools, _> = if value.is_array() {
                serde_path_to_error::deserialize(value).map(ListedTools::Bare)
            } else {
                serde_path_to_error::deserialize(value)
                    .map(|r: ToolsResult| ListedTools::Result { tools: r.tools })
            };
            let tools = match listed.map_err(|e| {
                ctx.err(
                    None,
                    "tools",
                    format!(
                        "{}: at `{}`: {}; expected {shape}",
                        p.display(),
                        e.path(),
                        e.inner()
                    ),
                )
            })? {
                ListedTools::Result { tools } | ListedTools::Bare(tools) => tools,
            };
            tools
                .into_iter()
                .enumerate()
                .map(|(i, t)| {
                    (
                        format!("{} tools[{i}]", p.display()),
                        RawTool {
                            name: t.name,
                            description: t.description,
                            input_schema: t.input_schema,
                            annotations: t.annotations,
                        },
                    )
                })
                .collect()
        }
    };
    if declared.is_empty() {
        return Err(ctx.err(None, "tools", "the file declares no tool"));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(declared.len());
    for (place, t) in declared {
        let field = |f: &str| format!("{place}.{f}");
        if t.name.trim().is_empty() {
            return Err(ctx.err(None, field("name"), "is empty"));
        }
        if !seen.insert(t.name.clone()) {
            return Err(ctx.err(
                None,
                field("name"),
                format!("duplicate tool `{}` (names must be unique)", t.name),
            ));
        }
        let schema = t
            .input_schema
            .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}));
        let is_object_schema = schema.as_object().is_some_and(|o| {
            o.get("type")
                .is_none_or(|ty| ty == &serde_json::Value::String("object".into()))
        });
        if !is_object_schema {
            return Err(ctx.err(
                None,
                field("input_schema"),
                format!(
                    "tool `{}`: an input schema is a JSON Schema object with `type = \"object\"` (MCP), got {schema}",
                    t.name
                ),
            ));
        }
        out.push(CatalogTool {
            name: t.name,
            description: t.description.unwrap_or_default(),
            input_schema: schema,
            annotations: t
                .annotations
                .as_ref()
                .map(tooltune_core::ToolAnnotations::from_mcp)
                .filter(|h| !h.is_empty()),
        });
    }
    Ok(Some(out))
}

impl Suite {
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
