//! Placeholder, replaced by the load driver.
fn main() {}
