//! Which models play the agent and the reflector, decided in one place: `--model` / `--reflector` (or their
//! environment variables `TOOLTUNE_AGENT` / `TOOLTUNE_REFLECTOR`), else the `[llm]` table of the config file
//! (`--config`, `TOOLTUNE_CONFIG`, or `config.toml` in the data directory), else the embedded 1.5B model.
//!
//! A run stores its models as spec strings so that `--resume` rebuilds the same ones: the short forms the command
//! line takes (`local:fast`, `openai:MODEL@URL`) as they are, a backend from the config file as its JSON. Neither
//! ever holds a key: an OpenAI-compatible backend names the environment variable that does.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use tooltune_llm::{BackendConfig, BackendSpec};

/// The model options of the commands that run the optimizer (`optimize`, `demo`).
#[derive(Debug, clap::Args)]
pub struct ModelArgs {
    /// The agent's model: local (Qwen2.5-Coder-1.5B), local:fast (0.5B), or openai:MODEL@BASE_URL [default: the
    /// config file's, else local]
    #[arg(long, env = "TOOLTUNE_AGENT")]
    pub model: Option<String>,
    /// The reflector's model [default: the config file's, else the agent's]
    #[arg(long, env = "TOOLTUNE_REFLECTOR")]
    pub reflector: Option<String>,
    /// Environment variable holding the API key of an OpenAI-compatible endpoint.
    #[arg(long)]
    pub api_key_env: Option<String>,
}

impl ModelArgs {
    /// The agent's and the reflector's spec strings (see [`resolve`]).
    pub fn resolve(&self, config: Option<&Path>) -> Result<(String, String)> {
        resolve(config, self.model.as_deref(), self.reflector.as_deref())
    }
}

/// The config file in use: the one given, else `config.toml` in the data directory when it exists.
pub fn config_path(given: Option<&Path>) -> Result<Option<PathBuf>> {
    if let Some(p) = given {
        return Ok(Some(p.to_path_buf()));
    }
    let default = crate::paths::data_dir()?.join("config.toml");
    Ok(default.exists().then_some(default))
}

/// Reads the `[llm]` table of a config file (other tables are left to whoever owns them).
pub fn load(path: &Path) -> Result<BackendConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the config file {}", path.display()))?;
    parse(&text).with_context(|| format!("config file {}", path.display()))
}

fn parse(text: &str) -> Result<BackendConfig> {
    let table: toml::Table = toml::from_str(text)?;
    match table.get("llm") {
        None => Ok(BackendConfig::default()),
        Some(v) => {
            let section = toml::to_string(v)?;
            Ok(BackendConfig::from_toml(&section).context("[llm]")?)
        }
    }
}

/// The agent's and the reflector's spec strings. Command-line values win over the file, the file over the
/// default; the reflector defaults to the agent.
pub fn resolve(
    config: Option<&Path>,
    model: Option<&str>,
    reflector: Option<&str>,
) -> Result<(String, String)> {
    let file = match config_path(config)? {
        Some(p) => Some(load(&p)?),
        None => None,
    };
    let to_string = |s: &BackendSpec| serde_json::to_string(s).unwrap_or_default();
    let agent = match (model, &file) {
        (Some(m), _) => m.to_string(),
        (None, Some(f)) => to_string(&f.agent),
        (None, None) => "local".to_string(),
    };
    let reflector = match (reflector, &file) {
        (Some(r), _) => r.to_string(),
        (None, Some(f)) if model.is_none() => to_string(f.reflector_spec()),
        (None, Some(f)) => f
            .reflector
            .as_ref()
            .map(to_string)
            .unwrap_or_else(|| agent.clone()),
        (None, None) => agent.clone(),
    };
    Ok((agent, reflector))
}

/// A stored or given spec string back to a backend: JSON from a config file, or a command-line short form.
pub fn spec(s: &str, key_env: Option<&str>) -> Result<BackendSpec> {
    if s.trim_start().starts_with('{') {
        return serde_json::from_str(s).with_context(|| format!("backend `{s}`"));
    }
    Ok(BackendSpec::parse(s, key_env)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_names_both_roles_and_the_command_line_wins() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tooltune.toml");
        std::fs::write(
            &path,
            "[llm.agent]\nkind = \"local\"\nmodel = \"fast\"\n\n[llm.reflector]\nkind = \"openai\"\n\
             model = \"m\"\nbase_url = \"http://127.0.0.1:9/v1\"\napi_key_env = \"MY_KEY\"\n",
        )
        .expect("write");
        let (a, r) = resolve(Some(&path), None, None).expect("resolve");
        assert!(matches!(
            spec(&a, None).expect("agent"),
            BackendSpec::Local {
                model: tooltune_llm::ModelChoice::Fast,
                ..
            }
        ));
        match spec(&r, None).expect("reflector") {
            BackendSpec::Openai {
                model, api_key_env, ..
            } => {
                assert_eq!(model, "m");
                assert_eq!(api_key_env, "MY_KEY");
            }
            other => panic!("reflector: {other:?}"),
        }
        // The stored string names the key's variable, never a key.
        assert!(r.contains("MY_KEY"));
        let (a, r) = resolve(Some(&path), Some("local"), None).expect("resolve");
        assert_eq!(a, "local");
        assert!(r.contains("openai"), "the file's reflector stays: {r}");
    }

    #[test]
    fn a_bad_file_names_the_file_and_the_table() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, "[llm.agent]\nkind = \"local\"\nmodle = \"fast\"\n").expect("write");
        let e = format!(
            "{:#}",
            resolve(Some(&path), None, None).expect_err("must fail")
        );
        assert!(
            e.contains("bad.toml") && e.contains("[llm]") && e.contains("modle"),
            "{e}"
        );
    }
}
