//! The `contractor` MCP server: two search tools whose scopes overlap, so that a description decides which
//! one gets a task. `search_docs` searches a bundled internal-docs corpus (engineering handbook, billing SDK
//! reference, HTTP API reference, on-call runbooks); `web_search` searches a bundled offline "web" corpus
//! (weather, sports, public facts, technology news). Facts exist in one corpus only, and some questions
//! have a conflicting public answer, so the answer check shows which tool was used.
//!
//! The seed descriptions are honest but weak on purpose: they are what tooltune starts optimising from,
//! and they are fixed in this file (a candidate description is applied host-side, never passed in here).
//! Runs with an empty environment; the data directory comes from `--data DIR` or defaults to the `data/`
//! folder shipped beside this crate.

mod search;

use anyhow::{Context, bail};
use clap::Parser;
use rmcp::{
    ErrorData as McpError, ServerHandler,
    handler::server::{router::tool::ToolRouter, wrapper::Parameters},
    model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig},
    schemars, tool, tool_handler, tool_router,
};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// Command line of the server.
#[derive(Debug, Parser)]
#[command(name = "contractor", version, about)]
struct Args {
    /// Directory holding the `docs/` and `web/` corpora (default: the `data/` folder shipped with the crate).
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// Serve Streamable HTTP at this loopback address (127.0.0.1:0 for any free port) instead of stdio.
    /// The URL is printed on stdout once the socket is bound.
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct SearchArgs {
    /// What to search for.
    query: String,
}

/// The server: one index per corpus.
#[derive(Debug, Clone)]
struct Contractor {
    docs: Arc<search::Index>,
    web: Arc<search::Index>,
    tool_router: ToolRouter<Self>,
}

fn search_result(index: &search::Index, query: &str) -> Result<CallToolResult, McpError> {
    if query.trim().is_empty() {
        return Ok(CallToolResult::error(vec![ContentBlock::text(
            "query is empty; give a few keywords to search for",
        )]));
    }
    Ok(CallToolResult::success(vec![ContentBlock::text(
        index.search(query),
    )]))
}

#[tool_router]
impl Contractor {
    fn new(docs: search::Index, web: search::Index) -> Self {
        Contractor {
            docs: Arc::new(docs),
            web: Arc::new(web),
            tool_router: Self::tool_router(),
        }
    }

    // Both searches only read their corpus: declared, so that hosts (and tooltune's own order warning) know a
    // rollout cannot change what the next one sees.
    #[tool(
        description = "Search the company's internal documentation.",
        annotations(read_only_hint = true)
    )]
    async fn search_docs(
        &self,
        Parameters(args): Parameters<SearchArgs>,
    ) -> Result<CallToolResult, McpError> {
        search_result(&self.docs, &args.query)
    }

    #[tool(description = "Search the web.", annotations(read_only_hint = true))]
    async fn web_search(
        &self,
        Parameters(args): Parameters<SearchArgs>,
    ) -> Result<CallToolResult, McpError> {
        search_result(&self.web, &args.query)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Contractor {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("contractor", env!("CARGO_PKG_VERSION")))
    }
}

fn default_data_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/data"))
}

fn load_index(dir: PathBuf) -> anyhow::Result<search::Index> {
    let index = search::Index::load(&dir)
        .with_context(|| format!("corpus {} cannot be read", dir.display()))?;
    if index.len() == 0 {
        bail!("corpus {} holds no passages", dir.display());
    }
    Ok(index)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let data = args.data.unwrap_or_else(default_data_dir);
    let server = Contractor::new(
        load_index(data.join("docs"))?,
        load_index(data.join("web"))?,
    );
    example_serve::serve(server, args.http).await?;
    Ok(())
}
