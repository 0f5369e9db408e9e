//! The trace store.
