//! Objectives, inflation measures and statistics for tooltune. Pure code: no IO, no clock, no randomness.
//!
//! Built so far: the statistics ([`stats`]) that every reported rate and comparison goes through. The objectives
//! (task success, selection rate) and inflation measures arrive with the optimizer.

pub mod stats;
