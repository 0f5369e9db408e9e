//! The tooltune binary.
fn main() {}
