//! The error for bad user input, shared by every crate (the simulator's scenario files, the
//! agents' configuration, the command lines). The binary maps it to exit status 2. It lives
//! here, in the pure crate every front end depends on, so that no crate needs the OS layer
//! only to report a bad value.

use std::fmt;

/// A value given by the user that is not allowed: names the value and what is allowed.
///
/// Any command that rejects its input returns this (possibly wrapped in `anyhow`
/// context); `main` prints the chain once and exits with status 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadInput {
    /// What the value is (`--threads`, `CPU id`, `workload`, `result file`).
    pub what: String,
    /// The value as given.
    pub value: String,
    /// What is allowed instead.
    pub allowed: String,
}

impl BadInput {
    pub fn new(what: impl Into<String>, value: impl fmt::Display, allowed: impl Into<String>) -> Self {
        Self { what: what.into(), value: value.to_string(), allowed: allowed.into() }
    }
}

impl fmt::Display for BadInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} '{}': allowed: {}", self.what, self.value, self.allowed)
    }
}

impl std::error::Error for BadInput {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_value_and_allowed() {
        let e = BadInput::new("--threads", 0, "1..=4096");
        assert_eq!(e.to_string(), "invalid --threads '0': allowed: 1..=4096");
    }
}
