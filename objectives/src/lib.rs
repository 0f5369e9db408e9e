//! Objectives and statistics.
