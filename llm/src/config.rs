//! Which backend plays the agent and which the reflector: one TOML section plus environment variables,
//! and the spec strings the CLI accepts (`local`, `local:fast`, `openai:MODEL@BASE_URL`).
//!
//! ```toml
//! [llm.agent]
//! kind = "local"
//! model = "default"          # or "fast"
//!
//! [llm.reflector]            # optional; defaults to the agent's backend
//! kind = "openai"
//! base_url = "https://example.invalid/v1"
//! model = "gpt-4o-mini"
//! api_key_env = "OPENAI_API_KEY"   # the variable's NAME; the key itself never goes in a file
//! ```
//! Environment: `TOOLTUNE_AGENT` and `TOOLTUNE_REFLECTOR` (spec strings) override the file;
//! `TOOLTUNE_API_KEY` is the default key variable; `TOOLTUNE_MODELS_DIR` moves the models folder.

use crate::fetch::ModelChoice;
#[cfg(feature = "local")]
use crate::local::{LocalModel, LocalOptions};
#[cfg(feature = "openai")]
use crate::openai::{OpenAiModel, OpenAiOptions};
use crate::{ChatModel, LlmError};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
#[cfg(feature = "openai")]
use std::time::Duration;

/// The environment variable an OpenAI-compatible endpoint's API key is read from unless the spec names another.
pub const DEFAULT_API_KEY_ENV: &str = "TOOLTUNE_API_KEY";

/// One backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum BackendSpec {
    /// The embedded llama.cpp model.
    Local {
        /// `default` (1.5B) or `fast` (0.5B).
        #[serde(default)]
        model: ModelChoice,
        /// Models folder (default: `$TOOLTUNE_MODELS_DIR` or the user's data folder).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        models_dir: Option<PathBuf>,
        /// Context size in tokens.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        n_ctx: Option<u32>,
        /// CPU threads.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        threads: Option<i32>,
    },
    /// An OpenAI-compatible endpoint.
    Openai {
        /// Base URL including `/v1`; omitted = OpenAI itself.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        base_url: Option<String>,
        /// Model name.
        model: String,
        /// Name of the environment variable holding the API key.
        #[serde(default = "default_key_env")]
        api_key_env: String,
        /// Per-request timeout in seconds (default 120).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_secs: Option<u64>,
        /// Retries on 429/5xx/connection errors (default 5).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_retries: Option<u32>,
        /// Requests in flight (default 4).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        concurrency: Option<usize>,
    },
}

fn default_key_env() -> String {
    DEFAULT_API_KEY_ENV.into()
}

impl Default for BackendSpec {
    fn default() -> Self {
        BackendSpec::Local {
            model: ModelChoice::Default,
            models_dir: None,
            n_ctx: None,
            threads: None,
        }
    }
}

impl BackendSpec {
    /// Parses `local`, `local:default`, `local:fast` or `openai:MODEL[@BASE_URL]`. `api_key_env` names
    /// the key variable for `openai` specs (default `TOOLTUNE_API_KEY`).
    pub fn parse(spec: &str, api_key_env: Option<&str>) -> Result<Self, LlmError> {
        let bad = |m: String| LlmError::config("backend spec", m);
        let spec = spec.trim();
        if let Some(rest) = spec.strip_prefix("local") {
            let which =
                match rest {
                    "" => ModelChoice::Default,
                    r => ModelChoice::parse(r.strip_prefix(':').ok_or_else(|| {
                        bad(format!("`{spec}`: expected `local` or `local:fast`"))
                    })?)?,
                };
            return Ok(BackendSpec::Local {
                model: which,
                models_dir: None,
                n_ctx: None,
                threads: None,
            });
        }
        if let Some(rest) = spec.strip_prefix("openai:") {
            let (model, base) = match rest.split_once('@') {
                Some((m, b)) => (m, Some(b.to_string())),
                None => (rest, None),
            };
            if model.is_empty() {
                return Err(bad(format!("`{spec}`: the model name is empty")));
            }
            if let Some(b) = &base
                && !(b.starts_with("http://") || b.starts_with("https://"))
            {
                return Err(bad(format!(
                    "`{spec}`: the base URL must start with http:// or https://"
                )));
            }
            return Ok(BackendSpec::Openai {
                base_url: base,
                model: model.to_string(),
                api_key_env: api_key_env.unwrap_or(DEFAULT_API_KEY_ENV).to_string(),
                timeout_secs: None,
                max_retries: None,
                concurrency: None,
            });
        }
        Err(bad(format!(
            "`{spec}`: expected `local`, `local:fast` or `openai:MODEL@BASE_URL`"
        )))
    }
}

/// The `[llm]` section: who plays which role.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// The agent that picks tools in evaluations.
    #[serde(default)]
    pub agent: BackendSpec,
    /// The reflector that diagnoses failures and proposes descriptions; `None` = same as the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reflector: Option<BackendSpec>,
}

impl BackendConfig {
    /// Parses the `[llm]` section's content (the table itself, not the whole file).
    pub fn from_toml(text: &str) -> Result<Self, LlmError> {
        toml::from_str(text).map_err(|e| LlmError::config("llm", e.to_string()))
    }

    /// Applies `TOOLTUNE_AGENT` / `TOOLTUNE_REFLECTOR` (spec strings), read through `get` so callers and
    /// tests can supply their own environment.
    pub fn with_env(mut self, get: impl Fn(&str) -> Option<String>) -> Result<Self, LlmError> {
        let key_env = get("TOOLTUNE_API_KEY_ENV");
        if let Some(s) = get("TOOLTUNE_AGENT").filter(|s| !s.is_empty()) {
            self.agent = BackendSpec::parse(&s, key_env.as_deref())
                .map_err(|e| LlmError::config("TOOLTUNE_AGENT", e.to_string()))?;
        }
        if let Some(s) = get("TOOLTUNE_REFLECTOR").filter(|s| !s.is_empty()) {
            self.reflector = Some(
                BackendSpec::parse(&s, key_env.as_deref())
                    .map_err(|e| LlmError::config("TOOLTUNE_REFLECTOR", e.to_string()))?,
            );
        }
        Ok(self)
    }

    /// The reflector's spec (the agent's when none is set).
    pub fn reflector_spec(&self) -> &BackendSpec {
        self.reflector.as_ref().unwrap_or(&self.agent)
    }
}

/// The two role players. When both roles name the same backend they share one instance (one loaded
/// model, one request limit).
#[derive(Clone)]
pub struct Roles {
    /// Picks tools.
    pub agent: Arc<dyn ChatModel>,
    /// Writes reflections and new descriptions.
    pub reflector: Arc<dyn ChatModel>,
}

/// Builds one backend. A local model is fetched if missing (with a progress bar on stderr) and loaded.
pub async fn build(spec: &BackendSpec) -> Result<Arc<dyn ChatModel>, LlmError> {
    match spec {
        #[cfg(feature = "local")]
        BackendSpec::Local {
            model,
            models_dir,
            n_ctx,
            threads,
        } => {
            let mut o = LocalOptions::for_model(*model);
            o.models_dir = models_dir.clone();
            if let Some(n) = n_ctx {
                o.n_ctx = *n;
            }
            if let Some(t) = threads {
                o.threads = *t;
            }
            let m = LocalModel::load(o).await?;
            // The cheap part of the engine check (AMX compiled in, instructions this CPU lacks, one probe with
            // known probabilities) before any run uses the model: a clear message instead of a crash mid-run.
            crate::local::check::preflight(&m, *model).await?;
            Ok(Arc::new(m))
        }
        #[cfg(feature = "openai")]
        BackendSpec::Openai {
            base_url,
            model,
            api_key_env,
            timeout_secs,
            max_retries,
            concurrency,
        } => {
            let mut o = OpenAiOptions::new(model.clone(), base_url.clone());
            o.api_key_env = api_key_env.clone();
            if let Some(t) = timeout_secs {
                o.timeout = Duration::from_secs(*t);
            }
            if let Some(r) = max_retries {
                o.max_retries = *r;
            }
            if let Some(c) = concurrency {
                o.concurrency = *c;
            }
            Ok(Arc::new(OpenAiModel::new(o)?))
        }
        #[cfg(not(feature = "local"))]
        BackendSpec::Local { .. } => Err(LlmError::config(
            "kind",
            "this build has no embedded model: build tooltune-llm with its `local` feature",
        )),
        #[cfg(not(feature = "openai"))]
        BackendSpec::Openai { .. } => Err(LlmError::config(
            "kind",
            "this build has no OpenAI-compatible backend: build tooltune-llm with its `openai` feature",
        )),
    }
}

/// Builds the agent and the reflector, sharing one instance when their specs are equal.
pub async fn build_roles(cfg: &BackendConfig) -> Result<Roles, LlmError> {
    let agent = build(&cfg.agent).await?;
    let reflector = if cfg.reflector_spec() == &cfg.agent {
        agent.clone()
    } else {
        build(cfg.reflector_spec()).await?
    };
    Ok(Roles { agent, reflector })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_strings_parse() {
        assert_eq!(
            BackendSpec::parse("local", None).expect("ok"),
            BackendSpec::default()
        );
        assert!(matches!(
            BackendSpec::parse("local:fast", None).expect("ok"),
            BackendSpec::Local {
                model: ModelChoice::Fast,
                ..
            }
        ));
        match BackendSpec::parse(
            "openai:gpt-4o-mini@http://127.0.0.1:8080/v1",
            Some("MY_KEY"),
        )
        .expect("ok")
        {
            BackendSpec::Openai {
                base_url,
                model,
                api_key_env,
                ..
            } => {
                assert_eq!(base_url.as_deref(), Some("http://127.0.0.1:8080/v1"));
                assert_eq!(model, "gpt-4o-mini");
                assert_eq!(api_key_env, "MY_KEY");
            }
            other => panic!("parsed as {other:?}"),
        }
        for bad in [
            "remote",
            "local:huge",
            "openai:",
            "openai:m@ftp://x",
            "localfast",
        ] {
            assert!(
                BackendSpec::parse(bad, None).is_err(),
                "{bad} should be rejected"
            );
        }
    }

    #[test]
    fn toml_section_roles_and_env_override() {
        let cfg = BackendConfig::from_toml(
            "[agent]\nkind = \"local\"\nmodel = \"fast\"\n\n[reflector]\nkind = \"openai\"\nmodel = \"m\"\nbase_url = \"http://h/v1\"\n",
        )
        .expect("parses");
        assert!(matches!(
            cfg.agent,
            BackendSpec::Local {
                model: ModelChoice::Fast,
                ..
            }
        ));
        assert!(
            matches!(cfg.reflector_spec(), BackendSpec::Openai { api_key_env, .. } if api_key_env == "TOOLTUNE_API_KEY")
        );
        let e = BackendConfig::from_toml("[agent]\nkind = \"local\"\nmodle = \"fast\"\n")
            .expect_err("typo");
        assert!(e.to_string().contains("modle"), "{e}");
        let env = |k: &str| (k == "TOOLTUNE_AGENT").then(|| "openai:x@https://h/v1".to_string());
        let cfg = BackendConfig::default().with_env(env).expect("env");
        assert!(matches!(cfg.agent, BackendSpec::Openai { ref model, .. } if model == "x"));
        assert_eq!(cfg.reflector_spec(), &cfg.agent);
        let bad = |k: &str| (k == "TOOLTUNE_REFLECTOR").then(|| "nope".to_string());
        let e = BackendConfig::default().with_env(bad).expect_err("bad env");
        assert!(e.to_string().contains("TOOLTUNE_REFLECTOR"), "{e}");
    }
}
