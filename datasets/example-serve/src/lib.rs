//! How the example MCP servers (`week01-tools`, `contractor`) serve: over stdio, or over Streamable HTTP on a
//! loopback address, printing the URL first so a caller that asked for port 0 learns the port.

use axum::serve::ListenerExt;
use rmcp::ServerHandler;
use rmcp::ServiceExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use std::io::Write;
use std::net::SocketAddr;

/// Why serving stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// HTTP was asked for on an address other than loopback: these are lab servers without authentication.
    #[error("--http {0}: only loopback addresses (127.0.0.1, ::1) are served")]
    NotLoopback(SocketAddr),
    /// The address could not be bound.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The transport failed to start or failed while serving.
    #[error("{what}: {message}")]
    Transport {
        /// Which step failed.
        what: &'static str,
        /// The transport's own message.
        message: String,
    },
}

/// Serves `server` on stdio, or on `http` (loopback only) when given, until the client or the process ends it.
pub async fn serve<S>(server: S, http: Option<SocketAddr>) -> Result<(), ServeError>
where
    S: ServerHandler + Clone + Send + Sync + 'static,
{
    match http {
        None => {
            let running = server.serve(rmcp::transport::stdio()).await.map_err(|e| {
                ServeError::Transport {
                    what: "stdio transport failed to start",
                    message: e.to_string(),
                }
            })?;
            running.waiting().await.map_err(|e| ServeError::Transport {
                what: "server task failed",
                message: e.to_string(),
            })?;
            Ok(())
        }
        Some(addr) => serve_http(server, addr).await,
    }
}

async fn serve_http<S>(server: S, addr: SocketAddr) -> Result<(), ServeError>
where
    S: ServerHandler + Clone + Send + Sync + 'static,
{
    if !addr.ip().is_loopback() {
        return Err(ServeError::NotLoopback(addr));
    }
    let config = StreamableHttpServerConfig::default().with_json_response(true);
    let service: StreamableHttpService<S, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(server.clone()), Default::default(), config);
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    let io = |what: &'static str| {
        move |e: std::io::Error| ServeError::Transport {
            what,
            message: e.to_string(),
        }
    };
    let bound = listener.local_addr().map_err(io("bound address unknown"))?;
    // A reply goes out as headers and body in separate writes; with Nagle's algorithm on, the body waits for the
    // client's delayed ACK of the headers (about 40 ms) on every call of a kept-alive connection.
    let listener = listener.tap_io(|tcp| {
        // Without it replies are slower, not wrong: nothing to report.
        let _ = tcp.set_nodelay(true);
    });
    let mut out = std::io::stdout().lock();
    writeln!(out, "http://{bound}/mcp").map_err(io("writing the URL"))?;
    out.flush().map_err(io("writing the URL"))?;
    drop(out);
    axum::serve(listener, router)
        .await
        .map_err(io("HTTP server failed"))
}
