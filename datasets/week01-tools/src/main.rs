//! The week01-tools MCP server: being written.
fn main() {}
