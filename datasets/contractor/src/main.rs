//! The contractor MCP server: being written.
fn main() {}
