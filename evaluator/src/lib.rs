//! The evaluator: being written (see ARCHITECTURE.md).
