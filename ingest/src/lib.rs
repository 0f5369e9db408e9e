//! Readers for trace formats: not written yet (see ARCHITECTURE.md).
