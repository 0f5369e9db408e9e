//! Writing a drafted suite: the TOML text of its header and tasks (in the format of docs/suite-format.md, read
//! back by the evaluator's loader before anything is written), paths made portable with the suite variables, and
//! files replaced atomically (a temporary file in the same folder, renamed over the target: the file is complete
//! or not written).

use crate::DraftError;
use crate::outcome::{Kept, Origin, TaskCheck};
use crate::parse::Check;
use serde_json::Value;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

/// A TOML string literal.
pub fn string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

fn key(k: &str) -> String {
    if !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        k.to_string()
    } else {
        string(k)
    }
}

/// A JSON value as an inline TOML value. TOML has no null: a `null` member of an object is left out (servers read
/// a missing optional argument the same way) and a `null` elsewhere becomes an empty table.
pub fn inline(v: &Value) -> String {
    match v {
        Value::Null => "{}".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => {
            if n.is_i64() || n.is_u64() {
                n.to_string()
            } else {
                // `{:?}` keeps a decimal point on whole floats (3.0), so the value stays a float.
                format!("{:?}", n.as_f64().unwrap_or(0.0))
            }
        }
        Value::String(s) => string(s),
        Value::Array(a) => format!("[{}]", a.iter().map(inline).collect::<Vec<_>>().join(", ")),
        Value::Object(m) => {
            let members: Vec<String> = m
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| format!("{} = {}", key(k), inline(v)))
                .collect();
            if members.is_empty() {
                "{}".into()
            } else {
                format!("{{ {} }}", members.join(", "))
            }
        }
    }
}

fn list(items: &[String]) -> String {
    format!(
        "[{}]",
        items
            .iter()
            .map(|s| string(s))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The header of a new suite: name, tools under study, fixture and server.
pub struct Header<'a> {
    /// The opening comment (how the file was made and what to read first), one or more lines without `#`.
    pub opening: &'a str,
    /// The suite's name.
    pub name: &'a str,
    /// Free text for `description`.
    pub description: &'a str,
    /// Every tool of the server, in its order.
    pub tools: &'a [String],
    /// The fixture's path as the suite file names it.
    pub fixture: Option<&'a str>,
    /// The server: `command` and `args` as the suite names them, or `url`.
    pub command: Option<(&'a str, &'a [String])>,
    /// The Streamable HTTP endpoint.
    pub url: Option<&'a str>,
    /// The protocol revision that worked, so eval goes straight to it. Without `command` and `url` (no server
    /// was given), a placeholder command is written with a comment saying to replace it.
    pub protocol: Option<&'a str>,
}

/// The header's TOML.
pub fn header(h: &Header) -> String {
    let mut s = String::new();
    for line in h.opening.lines() {
        s.push_str(&format!("# {line}\n").replace("# \n", "#\n"));
    }
    s.push_str(&format!("name = {}\n", string(h.name)));
    s.push_str(&format!("description = {}\n", string(h.description)));
    s.push_str(&format!("tools_under_study = {}\n", list(h.tools)));
    if let Some(f) = h.fixture {
        s.push_str(&format!("\n[fixture]\npath = {}\n", string(f)));
    }
    s.push_str("\n[server]\n");
    if let Some((command, args)) = h.command {
        s.push_str(&format!("command = {}\n", string(command)));
        s.push_str(&format!("args = {}\n", list(args)));
        if h.fixture.is_some() {
            // Servers that take paths then read relative ones inside the copy.
            s.push_str("cwd = \"${FIXTURE_DIR}\"\n");
        }
    }
    if let Some(u) = h.url {
        s.push_str(&format!("url = {}\n", string(u)));
    }
    if h.command.is_none() && h.url.is_none() {
        // The loader needs a server; a placeholder that says what it is fails loudly when started.
        s.push_str(
            "# No server was given when this file was made: replace the command below with the one that starts the\n\
             # server the logs came from (or set url), then run `tooltune suite check` on this file.\n",
        );
        s.push_str("command = \"replace-with-the-server-command\"\n");
    }
    if let Some(p) = h.protocol {
        s.push_str(&format!("protocol = {}\n", string(p)));
    }
    s
}

/// One task's `[[task]]` block.
pub fn task(t: &Kept, all_tools: &[String]) -> String {
    let mut s = String::from("\n[[task]]\n");
    s.push_str(&format!("id = {}\n", string(&t.id)));
    s.push_str(&format!("prompt = {}\n", string(&t.prompt)));
    s.push_str(&format!("split = {}\n", string(&t.split.to_string())));
    if let Some(o) = &t.owner {
        s.push_str(&format!("owner = {}\n", string(o)));
    }
    if let TaskCheck::Answer(c) = &t.check {
        match c {
            Check::Number(n) => {
                s.push_str(&format!("answer.number = {}\n", number(*n)));
                if c.tolerance() > 0.0 {
                    s.push_str(&format!("answer.tolerance = {:?}\n", c.tolerance()));
                }
            }
            Check::Contains(v) => s.push_str(&format!("answer.contains = {}\n", string(v))),
        }
    }
    match &t.owner {
        Some(o) => s.push_str(&format!(
            "expect_tools = {}\n",
            list(std::slice::from_ref(o))
        )),
        None => s.push_str(&format!("forbid_tools = {}\n", list(all_tools))),
    }
    if !t.reference.is_empty() {
        s.push_str("reference = [\n");
        for r in &t.reference {
            s.push_str(&format!(
                "  {{ tool = {}, arguments = {} }},\n",
                string(&r.tool),
                inline(&r.arguments)
            ));
        }
        s.push_str("]\n");
    }
    let mut prov = match &t.origin {
        Origin::Drafted { model } => vec![
            "drafted = true".to_string(),
            format!("model = {}", string(model)),
        ],
        Origin::Logged {
            trajectories,
            verified,
        } => vec![
            "from_traces = true".to_string(),
            format!("verified = {verified}"),
            format!("trajectories = {}", list(trajectories)),
        ],
        Origin::Earlier => Vec::new(),
    };
    prov.push(format!("kind = {}", string(t.kind.name())));
    if let Some(a) = t.kind.against() {
        prov.push(format!("against = {}", string(a)));
    }
    prov.push(format!(
        "check = {}",
        string(match t.check {
            TaskCheck::Answer(_) => "answer",
            TaskCheck::Routing(_) => "routing",
        })
    ));
    if let Some(d) = &t.digest {
        prov.push(format!("reference_sha256 = {}", string(d)));
    }
    s.push_str(&format!("provenance = {{ {} }}\n", prov.join(", ")));
    s
}

fn number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        format!("{n:?}")
    }
}

/// Writes `text` to `path` atomically: into a temporary file in the same folder, flushed, then renamed over `path`.
pub fn atomically(path: &Path, text: &str) -> Result<(), DraftError> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let io = |e: std::io::Error| DraftError::Write {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".tooltune-draft-")
        .tempfile_in(dir)
        .map_err(io)?;
    tmp.write_all(text.as_bytes()).map_err(io)?;
    // A temporary file is created readable by its owner only; a suite is an ordinary file (the target's own
    // permissions when it exists).
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let perms = std::fs::metadata(path)
            .map(|m| m.permissions())
            .unwrap_or_else(|_| std::fs::Permissions::from_mode(0o644));
        std::fs::set_permissions(tmp.path(), perms).map_err(io)?;
    }
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    Ok(())
}

/// `p` (absolute) relative to `base` (absolute), with `..` where it leaves `base`.
pub fn relative(p: &Path, base: &Path) -> PathBuf {
    let pc: Vec<Component> = p.components().collect();
    let bc: Vec<Component> = base.components().collect();
    let common = pc.iter().zip(&bc).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..bc.len() {
        out.push("..");
    }
    for c in &pc[common..] {
        out.push(c.as_os_str());
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

/// A command-line word as the suite writes it: a path that exists becomes portable (under the folder of
/// tooltune's executables `${TOOLTUNE_BIN_DIR}/…`, under the third-party folder `${TOOLTUNE_THIRD_PARTY}/…`, else
/// `${SUITE_DIR}/…` relative to the suite), so the suite holds no machine's absolute paths; anything else (a bare
/// program name, an option, `${FIXTURE_DIR}`) stays as it is.
pub fn portable(word: &str, suite_dir: &Path, bin_dir: &Path, third_party: &Path) -> String {
    if word.contains("${") || word.starts_with('-') || !word.contains(['/', '\\']) {
        return word.to_string();
    }
    let Ok(abs) = Path::new(word).canonicalize() else {
        return word.to_string();
    };
    for (var, root) in [
        ("${TOOLTUNE_BIN_DIR}", bin_dir),
        ("${TOOLTUNE_THIRD_PARTY}", third_party),
    ] {
        if let Ok(root) = root.canonicalize()
            && let Ok(rest) = abs.strip_prefix(&root)
        {
            return format!("{var}/{}", rest.display());
        }
    }
    match suite_dir.canonicalize() {
        Ok(base) => format!("${{SUITE_DIR}}/{}", relative(&abs, &base).display()),
        Err(_) => word.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn inline_values_are_toml_and_read_back_the_same() {
        let v = json!({"path": "notes \"2026\".txt", "n": 3, "x": 1.0, "deep": {"list": [1, "a", true]},
            "skip": null, "odd key": "v"});
        let text = format!("a = {}\n", inline(&v));
        let back: toml::Table = toml::from_str(&text).expect("valid TOML");
        let back = serde_json::to_value(&back["a"]).expect("json");
        let mut want = v.clone();
        want.as_object_mut().expect("object").remove("skip");
        assert_eq!(back, want);
    }

    #[test]
    fn relative_paths_climb_where_needed() {
        assert_eq!(
            relative(Path::new("/a/b/c"), Path::new("/a/x")),
            PathBuf::from("../b/c")
        );
        assert_eq!(
            relative(Path::new("/a"), Path::new("/a")),
            PathBuf::from(".")
        );
    }

    #[test]
    fn existing_paths_become_suite_variables() {
        let root = tempfile::tempdir().expect("tempdir");
        let (bin, tp, suites) = (
            root.path().join("bin"),
            root.path().join("tp"),
            root.path().join("suites"),
        );
        for d in [&bin, &tp, &suites, &root.path().join("data")] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        std::fs::write(bin.join("srv"), "").expect("write");
        std::fs::write(tp.join("index.js"), "").expect("write");
        let p = |w: &Path| portable(&w.to_string_lossy(), &suites, &bin, &tp);
        assert_eq!(p(&bin.join("srv")), "${TOOLTUNE_BIN_DIR}/srv");
        assert_eq!(p(&tp.join("index.js")), "${TOOLTUNE_THIRD_PARTY}/index.js");
        assert_eq!(p(&root.path().join("data")), "${SUITE_DIR}/../data");
        for w in [
            "node",
            "--with-list-files",
            "${FIXTURE_DIR}",
            "/no/such/path",
        ] {
            assert_eq!(portable(w, &suites, &bin, &tp), w);
        }
    }
}
