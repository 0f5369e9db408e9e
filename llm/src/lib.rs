//! Language-model backends: being written (see ARCHITECTURE.md).
