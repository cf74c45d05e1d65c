//! The `gleaner` binary's own parts, as a library so that tests walk the same command tree
//! the binary parses: [`cli`] (the clap definitions and their one-line errors) and
//! [`generate`] (completions and man pages from those definitions).

pub mod cli;
pub mod generate;
