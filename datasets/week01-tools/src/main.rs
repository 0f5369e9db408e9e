//! The lecture's lab MCP server, `week01-tools`: `calculator`, `read_file` and a switchable third tool,
//! `list_files`, over stdio (default) or Streamable HTTP on a loopback address (`--http ADDR`).
//!
//! Tool descriptions are fixed here, in the server, on purpose: tooltune applies a candidate description on
//! the host side, so the server never takes one from a flag or the environment. The server runs with an
//! empty environment; its data directory comes from `--data DIR` (suites pass it) or defaults to the
//! `data/` folder shipped beside this crate.

mod calc;
mod jail;

use anyhow::Context;
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

/// Command line of the server.
#[derive(Debug, Parser)]
#[command(name = "week01-tools", version, about)]
struct Args {
    /// Directory the file tools are confined to (default: the `data/` folder shipped with the crate).
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// Serve Streamable HTTP at this loopback address (e.g. 127.0.0.1:8000, or 127.0.0.1:0 for any free
    /// port) instead of stdio. The URL is printed on stdout once the socket is bound.
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// Also offer the third tool, `list_files` (the lab's "tool added to the server only"). The
    /// environment variable WEEK01_LIST_FILES=1 does the same.
    #[arg(long)]
    with_list_files: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct CalculatorArgs {
    /// The arithmetic expression to evaluate, e.g. "2 * (3 + 4)".
    expression: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct ReadFileArgs {
    /// Path of the file, relative to the server's directory, e.g. "notes.txt".
    path: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct ListFilesArgs {
    /// Folder to list, relative to the server's directory; empty or "." for the top level.
    #[serde(default)]
    path: Option<String>,
}

/// The server: its confined data directory and its tools.
#[derive(Debug, Clone)]
struct Week01Tools {
    jail: jail::Jail,
    tool_router: ToolRouter<Self>,
}

fn text_result(text: String) -> Result<CallToolResult, McpError> {
    Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
}

fn error_result(text: String) -> Result<CallToolResult, McpError> {
    Ok(CallToolResult::error(vec![ContentBlock::text(text)]))
}

#[tool_router]
impl Week01Tools {
    fn new(jail: jail::Jail, with_list_files: bool) -> Self {
        let mut tool_router = Self::tool_router();
        if !with_list_files {
            tool_router.remove_route("list_files");
        }
        Week01Tools { jail, tool_router }
    }

    #[tool(
        description = "Evaluate an arithmetic expression such as '3 * (4 + 5)'. Numbers and + - * / ** only.",
        annotations(read_only_hint = true)
    )]
    async fn calculator(
        &self,
        Parameters(args): Parameters<CalculatorArgs>,
    ) -> Result<CallToolResult, McpError> {
        match calc::evaluate(&args.expression) {
            Ok(v) => text_result(v.to_string()),
            Err(e) => error_result(format!("cannot evaluate {:?}: {e}", args.expression)),
        }
    }

    #[tool(
        description = "Read a text file inside the server's working directory. Returns at most 4000 characters.",
        annotations(read_only_hint = true)
    )]
    async fn read_file(
        &self,
        Parameters(args): Parameters<ReadFileArgs>,
    ) -> Result<CallToolResult, McpError> {
        match self.jail.read_text(&args.path) {
            Ok(t) => text_result(t),
            Err(e) => error_result(e),
        }
    }

    #[tool(
        description = "List the files and folders in a folder inside the server's working directory (default: the top level), with file sizes.",
        annotations(read_only_hint = true)
    )]
    async fn list_files(
        &self,
        Parameters(args): Parameters<ListFilesArgs>,
    ) -> Result<CallToolResult, McpError> {
        match self.jail.list(args.path.as_deref().unwrap_or(".")) {
            Ok(t) => text_result(t),
            Err(e) => error_result(e),
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Week01Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new("week01-tools", env!("CARGO_PKG_VERSION")),
        )
    }
}

fn default_data_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/data"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let data = args.data.unwrap_or_else(default_data_dir);
    let jail = jail::Jail::new(&data)
        .with_context(|| format!("data directory {} cannot be opened", data.display()))?;
    let with_list_files =
        args.with_list_files || std::env::var("WEEK01_LIST_FILES").is_ok_and(|v| v == "1");
    let server = Week01Tools::new(jail, with_list_files);
    example_serve::serve(server, args.http).await?;
    Ok(())
}
