//! The command line of `gleaner`: the clap tree (one subcommand per crate that owns it) and
//! how its own errors reach the user: one line naming the flag, the value and what is allowed,
//! as [`gleaner_os::BadInput`] prints (`gleaner: invalid --flag 'value': allowed: ...`), never
//! clap's multi-line usage.
//!
//! Every numeric option documents its range in its help, as `LO..=HI` or as an interval
//! (`(0, 1]`); [`documented_range`] reads it back, so a value clap cannot parse is answered
//! with the range its help promises, and `tests/cli.rs` feeds every option a value outside it.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, Parser, Subcommand};

use crate::generate;

/// Gleaner: mitigate the blocked-waiter wakeup problem of multithreaded programs in VMs,
/// type vCPUs on KVM hosts (AQL_Sched), and measure virtualization overhead.
#[derive(Debug, Parser)]
#[command(name = "gleaner", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Benchmarks: wakeup latency (Table 2), workload kernels, external commands, overhead metrics.
    Bench(gleaner_bench::BenchArgs),
    /// Tell whether this machine suffers from the blocked-waiter wakeup problem.
    Diagnose(gleaner_bench::DiagnoseArgs),
    #[command(flatten)]
    Agent(gleaner_agent::AgentCommand),
    /// Discrete-event simulator of two-level scheduling running the real policies.
    Sim(gleaner_sim::SimArgs),
    /// Host-side AQL_Sched for Linux/KVM: vCPU typing, pCPU pools, per-type slices.
    Host(gleaner_host::HostArgs),
    /// Real QEMU guests for the UC / OC / OC2 experiments.
    Lab(gleaner_lab::LabArgs),
    /// Print the shell completion script for gleaner, generated from its command line.
    ///
    /// Install it where the shell looks for completions, e.g. bash:
    /// `gleaner completions bash > /usr/share/bash-completion/completions/gleaner`; zsh: a file
    /// `_gleaner` in a directory of $fpath; fish: `~/.config/fish/completions/gleaner.fish`.
    /// The Debian package installs the bash, zsh and fish scripts.
    Completions {
        /// The shell: bash, elvish, fish, powershell or zsh.
        #[arg(value_name = "SHELL", value_parser = generate::ShellName)]
        shell: String,
    },
    /// Write the man pages, generated from the command line: gleaner.1 and one per subcommand
    /// (gleaner-run.1, gleaner-bench-wakeup.1, ...). Used by scripts/build-deb.sh.
    #[command(hide = true)]
    ManPages {
        /// Directory to write the pages into (created if missing).
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

/// A range an option's help documents: `1..=4096`, `(0, 1]`, `[0, 1)`; the bounds as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentedRange {
    pub lo: String,
    /// The low bound is excluded (`(0, 1]`).
    pub lo_open: bool,
    pub hi: String,
    /// The high bound is excluded (`[0, 1)`).
    pub hi_open: bool,
    /// The range as the help writes it.
    pub text: String,
}

/// A number as help texts write one: digits, an optional sign and decimal point.
fn number_at_end(s: &str) -> Option<&str> {
    let start = s.rfind(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-')).map_or(0, |i| i + 1);
    let n = s[start..].trim_start_matches('.');
    (n.chars().any(|c| c.is_ascii_digit())).then_some(n)
}

fn number_at_start(s: &str) -> Option<&str> {
    let end = s.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-')).unwrap_or(s.len());
    let n = s[..end].trim_end_matches('.');
    (n.chars().any(|c| c.is_ascii_digit())).then_some(n)
}

/// The first range `help` documents: `LO..=HI`, or an interval `(LO, HI]` / `[LO, HI)` /
/// `(LO, HI)` / `[LO, HI]`.
pub fn documented_range(help: &str) -> Option<DocumentedRange> {
    let inclusive = help.find("..=").and_then(|i| {
        let (lo, hi) = (number_at_end(&help[..i])?, number_at_start(&help[i + 3..])?);
        Some((i, DocumentedRange { lo: lo.into(), lo_open: false, hi: hi.into(), hi_open: false, text: format!("{lo}..={hi}") }))
    });
    let interval = help.char_indices().filter(|(_, c)| *c == '(' || *c == '[').find_map(|(i, open)| {
        let rest = &help[i + 1..];
        let lo = number_at_start(rest)?;
        let rest = rest[lo.len()..].strip_prefix(", ")?;
        let hi = number_at_start(rest)?;
        let close = rest[hi.len()..].chars().next().filter(|c| *c == ')' || *c == ']')?;
        let text = format!("{open}{lo}, {hi}{close}");
        Some((i, DocumentedRange { lo: lo.into(), lo_open: open == '(', hi: hi.into(), hi_open: close == ')', text }))
    });
    match (inclusive, interval) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a.1 } else { b.1 }),
        (a, b) => a.or(b).map(|(_, r)| r),
    }
}

/// The subcommands `argv` names, in order (`["bench", "wakeup"]`), as far as they are
/// subcommands of `cmd`.
fn command_path(cmd: &clap::Command, argv: &[OsString]) -> Vec<String> {
    let mut path = Vec::new();
    let mut at = cmd;
    for a in argv.iter().skip(1) {
        let Some(a) = a.to_str() else { break };
        if a == "--" {
            break;
        }
        if let Some(sub) = at.find_subcommand(a) {
            path.push(sub.get_name().to_string());
            at = sub;
        }
    }
    path
}

fn subcommand<'a>(cmd: &'a clap::Command, path: &[String]) -> &'a clap::Command {
    path.iter().fold(cmd, |c, name| c.find_subcommand(name).unwrap_or(c))
}

/// `--flag` of clap's `--flag <VALUE>` (or `<NAME>` of a positional).
fn flag_name(arg: &str) -> &str {
    arg.split_whitespace().next().unwrap_or(arg)
}

fn context(err: &clap::Error, kind: ContextKind) -> Option<String> {
    err.get(kind).map(|v| match v {
        ContextValue::Strings(s) => s.join(", "),
        ContextValue::StyledStrs(s) => s.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    })
}

/// What a value of `flag` may be, from its help: the documented range, else its possible
/// values, else its value name.
fn allowed_for(cmd: &clap::Command, flag: &str) -> Option<String> {
    let arg = cmd.get_arguments().find(|a| {
        a.get_long().is_some_and(|l| flag == format!("--{l}"))
            || a.get_short().is_some_and(|s| flag == format!("-{s}"))
            || (a.is_positional() && a.get_value_names().is_some_and(|v| v.iter().any(|n| flag == format!("<{n}>"))))
    })?;
    let help = arg.get_long_help().or(arg.get_help()).map(|h| h.to_string()).unwrap_or_default();
    if let Some(r) = documented_range(&help) {
        return Some(r.text);
    }
    let values: Vec<String> = arg.get_possible_values().iter().filter(|v| !v.is_hide_set()).map(|v| v.get_name().to_string()).collect();
    if !values.is_empty() {
        return Some(values.join(", "));
    }
    arg.get_value_names().and_then(|v| v.first()).map(|n| format!("a {n}"))
}

/// clap's error as one line (without `gleaner: `), for `argv` parsed by `cmd`.
pub fn error_line(err: &clap::Error, cmd: &clap::Command, argv: &[OsString]) -> String {
    let path = command_path(cmd, argv);
    let at = subcommand(cmd, &path);
    let command = std::iter::once("gleaner").chain(path.iter().map(String::as_str)).collect::<Vec<_>>().join(" ");
    let arg = context(err, ContextKind::InvalidArg);
    let flag = arg.as_deref().map(flag_name).unwrap_or("").to_string();
    let value = context(err, ContextKind::InvalidValue).unwrap_or_default();
    let suggestion = context(err, ContextKind::SuggestedArg)
        .or_else(|| context(err, ContextKind::SuggestedSubcommand))
        .or_else(|| context(err, ContextKind::SuggestedValue))
        .map(|s| format!(" (did you mean '{s}'?)"))
        .unwrap_or_default();
    let subcommands = || at.get_subcommands().filter(|s| !s.is_hide_set()).map(|s| s.get_name().to_string()).collect::<Vec<_>>().join(", ");
    match err.kind() {
        ErrorKind::InvalidValue if value.is_empty() => {
            let allowed = allowed_for(at, &flag).unwrap_or_else(|| "a value".into());
            format!("missing value for {flag}: allowed: {allowed}")
        }
        ErrorKind::InvalidValue => {
            let allowed = context(err, ContextKind::ValidValue).or_else(|| allowed_for(at, &flag)).unwrap_or_else(|| "see --help".into());
            format!("invalid {flag} '{value}': allowed: {allowed}{suggestion}")
        }
        ErrorKind::ValueValidation => {
            let why = std::error::Error::source(err).map(|s| s.to_string()).unwrap_or_default();
            // clap's ranged parsers say "V is not in LO..=HI": the range is what is allowed.
            let why = why.strip_prefix(&format!("{value} is not in ")).unwrap_or(&why).to_string();
            let allowed = match allowed_for(at, &flag) {
                Some(a) if a == why || why.is_empty() => a,
                Some(a) => format!("{a} ({why})"),
                None => why,
            };
            format!("invalid {flag} '{value}': allowed: {allowed}")
        }
        ErrorKind::UnknownArgument => {
            let given = arg.unwrap_or_default();
            format!("invalid option '{given}' for `{command}`: allowed: the options of `{command} --help`{suggestion}")
        }
        ErrorKind::InvalidSubcommand => {
            let given = context(err, ContextKind::InvalidSubcommand).unwrap_or_default();
            format!("invalid command '{given}': allowed: {}{suggestion}", subcommands())
        }
        ErrorKind::MissingSubcommand | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            format!("missing command after `{command}`: allowed: {}", subcommands())
        }
        ErrorKind::MissingRequiredArgument => {
            format!("missing {} for `{command}` (see `{command} --help`)", arg.unwrap_or_default())
        }
        ErrorKind::ArgumentConflict => {
            let prior = context(err, ContextKind::PriorArg).unwrap_or_default();
            format!("invalid {flag} with {}: allowed: one of them, not both", flag_name(&prior))
        }
        ErrorKind::WrongNumberOfValues | ErrorKind::TooManyValues | ErrorKind::TooFewValues => {
            let expected =
                context(err, ContextKind::ExpectedNumValues).map(|n| format!("{n} value(s)")).unwrap_or_else(|| "see --help".into());
            format!("invalid {flag} '{value}': allowed: {expected}")
        }
        ErrorKind::NoEquals => format!("invalid {flag}: allowed: {flag}=VALUE"),
        _ => {
            // Anything else: clap's own first line, without its "error: ".
            let text = err.render().to_string();
            let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("invalid command line");
            first.strip_prefix("error: ").unwrap_or(first).trim().to_string()
        }
    }
}

/// Parses the process's arguments; help and version are printed as clap prints them (exit 0),
/// any other error as one line on stderr (exit 2).
/// The agent's commands alone, under the same name and settings: what `gleaner run` and
/// `gleaner attach` are parsed with first ([`parse`]).
#[derive(Debug, Parser)]
#[command(name = "gleaner", version, propagate_version = true)]
struct AgentCli {
    #[command(subcommand)]
    command: gleaner_agent::AgentCommand,
}

/// `run` and `attach` parsed on the agent's part of the tree only, or `None`: clap builds the
/// whole tree (every subcommand of bench, sim, host, lab, with their help) before it parses,
/// ~1 ms natively but ~0.15 s of CPU in an emulated guest, paid by every short `gleaner run`
/// before its workload starts. The definitions are the same ones, so what this accepts the
/// whole tree accepts alike; anything else (help, version, an error) goes to the whole tree,
/// which answers as always.
fn parse_agent_run(argv: &[OsString]) -> Option<Cli> {
    if !argv.get(1).is_some_and(|a| a == "run" || a == "attach") {
        return None;
    }
    AgentCli::try_parse_from(argv).ok().map(|c| Cli { command: Command::Agent(c.command) })
}

pub fn parse() -> Result<Cli, std::process::ExitCode> {
    let argv: Vec<OsString> = std::env::args_os().collect();
    if let Some(cli) = parse_agent_run(&argv) {
        return Ok(cli);
    }
    Cli::try_parse_from(&argv).map_err(|err| match err.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = err.print();
            std::process::ExitCode::SUCCESS
        }
        _ => {
            eprintln!("gleaner: {}", error_line(&err, &Cli::command(), &argv));
            std::process::ExitCode::from(2)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(args: &[&str]) -> String {
        let argv: Vec<OsString> = args.iter().map(OsString::from).collect();
        let err = Cli::try_parse_from(&argv).unwrap_err();
        error_line(&err, &Cli::command(), &argv)
    }

    #[test]
    fn run_and_attach_parse_alike_on_the_agent_s_tree_and_the_whole_one() {
        for args in [
            &["gleaner", "run", "--", "true"][..],
            &["gleaner", "run", "--budget", "0.5", "--no-trace", "--events", "/tmp/e", "--", "sh", "-c", "x --help"],
            &["gleaner", "attach", "--pid", "1"],
        ] {
            let argv: Vec<OsString> = args.iter().map(OsString::from).collect();
            let fast = parse_agent_run(&argv).unwrap_or_else(|| panic!("{args:?}: not parsed on the agent's tree"));
            assert_eq!(format!("{fast:?}"), format!("{:?}", Cli::try_parse_from(&argv).unwrap()), "{args:?}");
        }
        // Help, errors and other commands go to the whole tree.
        for args in [&["gleaner", "run", "--help"][..], &["gleaner", "run", "--bogus", "--", "true"], &["gleaner", "bench", "rate"]] {
            let argv: Vec<OsString> = args.iter().map(OsString::from).collect();
            assert!(parse_agent_run(&argv).is_none(), "{args:?}");
        }
    }

    #[test]
    fn ranges_are_read_as_the_help_writes_them() {
        let r = documented_range("Rounds per setting (1..=1000000).").unwrap();
        assert_eq!((r.lo.as_str(), r.hi.as_str(), r.lo_open, r.hi_open, r.text.as_str()), ("1", "1000000", false, false, "1..=1000000"));
        let r = documented_range("Share of the time, in (0, 1] (default 1).").unwrap();
        assert_eq!((r.lo.as_str(), r.hi.as_str(), r.lo_open, r.hi_open, r.text.as_str()), ("0", "1", true, false, "(0, 1]"));
        let r = documented_range("a share in [0, 0.5) of the vCPUs").unwrap();
        assert_eq!((r.lo.as_str(), r.hi.as_str(), r.lo_open, r.hi_open), ("0", "0.5", false, true));
        // The first one written counts; a parenthesis that is no interval is passed over.
        let r = documented_range("(default 2) within 0.5..=64 and (1, 2]").unwrap();
        assert_eq!(r.text, "0.5..=64");
        assert_eq!(documented_range("A CPU list (e.g. 0-3)."), None);
        assert_eq!(documented_range(""), None);
    }

    #[test]
    fn clap_errors_are_one_line_naming_the_flag_the_value_and_what_is_allowed() {
        assert_eq!(line(&["gleaner", "bench", "wakeup", "--setting", "F"]), "invalid --setting 'F': allowed: A, B, C, D, E");
        let l = line(&["gleaner", "run", "--retention-start", "maybe", "--", "true"]);
        assert_eq!(l, "invalid --retention-start 'maybe': allowed: calibrated, on, off");
        let l = line(&["gleaner", "bench", "wakeup", "--rounds", "x"]);
        assert!(l.starts_with("invalid --rounds 'x': allowed: "), "{l}");
        let l = line(&["gleaner", "bench", "workload", "pingpong", "--rounds", "5", "--duration-ms", "5"]);
        assert_eq!(l, "invalid --rounds with --duration-ms: allowed: one of them, not both");
        let l = line(&["gleaner", "bench", "wakeup", "--no-such-flag"]);
        assert!(l.starts_with("invalid option '--no-such-flag' for `gleaner bench wakeup`"), "{l}");
        let l = line(&["gleaner", "bench", "wakeup", "--rounds"]);
        assert!(l.starts_with("missing value for --rounds: allowed: "), "{l}");
        let l = line(&["gleaner", "no-such-command"]);
        assert!(l.starts_with("invalid command 'no-such-command': allowed: bench, diagnose, run"), "{l}");
        let l = line(&["gleaner", "bench"]);
        assert!(l.starts_with("missing command after `gleaner bench`: allowed: wakeup, workload"), "{l}");
        let l = line(&["gleaner", "attach"]);
        assert!(l.starts_with("missing --cgroup <PATH>") && l.contains("`gleaner attach`"), "{l}");
        for l in [l, line(&["gleaner", "bench", "wakeup", "--setting", "F"])] {
            assert_eq!(l.lines().count(), 1, "{l}");
        }
    }
}
