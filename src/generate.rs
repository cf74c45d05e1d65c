//! Files generated from the command line's own definitions, for packaging: shell completion
//! scripts (`gleaner completions SHELL`, clap_complete) and man pages (`gleaner man-pages DIR`,
//! clap_mangen). Nothing here is written by hand, so the help text, the completions and the man
//! pages cannot disagree.

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::builder::{PossibleValue, TypedValueParser};
use clap::ValueEnum;
use clap_complete::Shell;
use gleaner_os::BadInput;

/// The shells `gleaner completions` writes a script for, as typed on the command line.
const SHELLS: &str = "bash, elvish, fish, powershell, zsh";

/// Value parser of the SHELL argument: takes any string, so that a wrong name is reported by
/// [`completions`] as one line naming the value and the allowed ones ([`BadInput`], exit 2),
/// while still telling `--help` and the completion scripts which shells there are.
#[derive(Clone, Copy, Debug)]
pub struct ShellName;

impl TypedValueParser for ShellName {
    type Value = String;

    fn parse_ref(&self, _cmd: &clap::Command, _arg: Option<&clap::Arg>, value: &OsStr) -> Result<String, clap::Error> {
        Ok(value.to_string_lossy().into_owned())
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(Shell::value_variants().iter().filter_map(ValueEnum::to_possible_value)))
    }
}

/// The shell named `name` (one of [`SHELLS`], case-insensitive).
pub fn parse_shell(name: &str) -> Result<Shell, BadInput> {
    Shell::from_str(name, true).map_err(|_| BadInput::new("shell", name, SHELLS))
}

/// A boolean setting of a command, such as [`clap::Command::propagate_version`].
type Setter = fn(clap::Command, bool) -> clap::Command;

/// `cmd` without its hidden subcommands, at any depth. clap_complete, unlike clap_mangen, offers
/// hidden subcommands (clap issue 1335), and `__guardian` (internal) and `man-pages` (packaging)
/// are not for people. clap cannot remove a subcommand, so a command with hidden subcommands is
/// rebuilt from what completion scripts use (name, version, about, arguments, groups, the
/// settings that add or require flags and subcommands); the others are kept as they are.
pub fn without_hidden_subcommands(cmd: &clap::Command) -> clap::Command {
    let visible = cmd.get_subcommands().filter(|s| !s.is_hide_set()).map(|s| {
        if s.get_subcommands().any(clap::Command::is_hide_set) {
            without_hidden_subcommands(s)
        } else {
            s.clone()
        }
    });
    let mut out = clap::Command::new(cmd.get_name().to_owned())
        .args(cmd.get_arguments().cloned())
        .groups(cmd.get_groups().cloned())
        .subcommands(visible);
    // Only settings that are set are copied: setting one to false unsets it, which for a global
    // setting (propagate_version) would also undo what a parent propagates.
    let settings: [(bool, Setter); 8] = [
        (cmd.is_propagate_version_set(), clap::Command::propagate_version),
        (cmd.is_subcommand_required_set(), clap::Command::subcommand_required),
        (cmd.is_arg_required_else_help_set(), clap::Command::arg_required_else_help),
        (cmd.is_args_conflicts_with_subcommands_set(), clap::Command::args_conflicts_with_subcommands),
        (cmd.is_subcommand_negates_reqs_set(), clap::Command::subcommand_negates_reqs),
        (cmd.is_disable_help_subcommand_set(), clap::Command::disable_help_subcommand),
        (cmd.is_disable_help_flag_set(), clap::Command::disable_help_flag),
        // is_disable_version_flag_set() is also true of a command without a version of its own,
        // to which a parent may still propagate one: copied only for a command with a version.
        (
            cmd.is_disable_version_flag_set() && (cmd.get_version().is_some() || cmd.get_long_version().is_some()),
            clap::Command::disable_version_flag,
        ),
    ];
    for (set, setter) in settings {
        if set {
            out = setter(out, true);
        }
    }
    if let Some(v) = cmd.get_version() {
        out = out.version(v.to_owned());
    }
    if let Some(v) = cmd.get_long_version() {
        out = out.long_version(v.to_owned());
    }
    if let Some(a) = cmd.get_about() {
        out = out.about(a.clone());
    }
    if let Some(a) = cmd.get_long_about() {
        out = out.long_about(a.clone());
    }
    out
}

/// The completion script of `cmd` for `shell`, without hidden subcommands.
pub fn completion_script(cmd: clap::Command, shell: Shell) -> Vec<u8> {
    let mut cmd = without_hidden_subcommands(&cmd);
    let name = cmd.get_name().to_string();
    let mut script = Vec::new();
    // Into memory: clap_complete panics on a failed write, and standard output can fail (a
    // closed pipe); the write in `completions` reports that as an error instead.
    clap_complete::generate(shell, &mut cmd, name, &mut script);
    script
}

/// Writes the completion script of `cmd` for the shell named `shell` to standard output.
pub fn completions(cmd: clap::Command, shell: &str) -> anyhow::Result<ExitCode> {
    let script = completion_script(cmd, parse_shell(shell)?);
    let mut out = std::io::stdout().lock();
    out.write_all(&script).and_then(|()| out.flush()).context("writing the completion script to standard output")?;
    Ok(ExitCode::SUCCESS)
}

/// Writes one man page for `cmd` and one for each of its visible subcommands (nested ones too:
/// `gleaner.1`, `gleaner-run.1`, `gleaner-bench-wakeup.1`, ...) into `dir`, creating it, and
/// returns their paths, sorted.
pub fn man_pages(cmd: clap::Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    clap_mangen::generate_to(cmd, dir).with_context(|| format!("writing man pages into {}", dir.display()))?;
    let mut pages: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "1"))
        .collect();
    pages.sort();
    Ok(pages)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd() -> clap::Command {
        clap::Command::new("demo")
            .version("1.2.3")
            .about("A demo.")
            .subcommand(clap::Command::new("run").about("Run it.").subcommand(clap::Command::new("fast").about("Quickly.")))
            .subcommand(clap::Command::new("secret").hide(true))
    }

    #[test]
    fn every_listed_shell_parses_and_others_are_named() {
        for name in SHELLS.split(", ") {
            assert!(parse_shell(name).is_ok(), "{name}");
        }
        assert_eq!(parse_shell("Bash").unwrap(), Shell::Bash);
        let e = parse_shell("tcsh").unwrap_err();
        assert_eq!(e.to_string(), format!("invalid shell 'tcsh': allowed: {SHELLS}"));
    }

    #[test]
    fn the_parser_lists_exactly_the_shells_it_accepts() {
        let listed: Vec<String> = ShellName.possible_values().unwrap().map(|v| v.get_name().to_string()).collect();
        assert_eq!(listed.join(", "), SHELLS);
    }

    /// A command with hidden subcommands at two depths, or the same command without them.
    fn demo(with_hidden: bool) -> clap::Command {
        let run = clap::Command::new("run").about("Run it.").subcommand(clap::Command::new("fast").about("Quickly."));
        let mut tools = clap::Command::new("tools").about("Tools.").arg(clap::arg!(--all "Everything"));
        let mut demo = clap::Command::new("demo")
            .version("1.2.3")
            .about("A demo.")
            .long_about("A demo, at length.")
            .propagate_version(true)
            .subcommand_required(true)
            .arg(clap::arg!(-v --verbose "Talk"));
        if with_hidden {
            tools = tools.subcommand(clap::Command::new("inner-secret").hide(true));
        }
        demo = demo.subcommand(run).subcommand(tools);
        if with_hidden {
            demo = demo.subcommand(clap::Command::new("secret").hide(true));
        }
        demo
    }

    #[test]
    fn completion_scripts_are_those_of_the_command_without_its_hidden_subcommands() {
        for shell in [Shell::Bash, Shell::Elvish, Shell::Fish, Shell::PowerShell, Shell::Zsh] {
            let mut expected = Vec::new();
            clap_complete::generate(shell, &mut demo(false), "demo", &mut expected);
            let script = completion_script(demo(true), shell);
            assert_eq!(String::from_utf8(script).unwrap(), String::from_utf8(expected).unwrap(), "{shell}");
        }
        // And the generator alone would offer them (why `without_hidden_subcommands` exists).
        let mut raw = Vec::new();
        clap_complete::generate(Shell::Bash, &mut demo(true), "demo", &mut raw);
        assert!(String::from_utf8(raw).unwrap().contains("secret"));
    }

    #[test]
    fn completion_scripts_name_the_binary() {
        let bash = String::from_utf8(completion_script(cmd(), Shell::Bash)).unwrap();
        assert!(bash.contains("_demo()") && bash.contains("complete -F _demo"), "{bash}");
        let zsh = String::from_utf8(completion_script(cmd(), Shell::Zsh)).unwrap();
        assert!(zsh.starts_with("#compdef demo"), "{zsh}");
        let fish = String::from_utf8(completion_script(cmd(), Shell::Fish)).unwrap();
        assert!(fish.contains("complete -c demo"), "{fish}");
    }

    #[test]
    fn man_pages_cover_visible_subcommands_only() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("man1");
        let pages = man_pages(cmd(), &out).unwrap();
        let names: Vec<String> = pages.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["demo-run-fast.1", "demo-run.1", "demo.1"]);
        let top = std::fs::read_to_string(out.join("demo.1")).unwrap();
        assert!(top.contains(".TH demo 1"), "{top}");
        assert!(top.contains("demo\\-run(1)"), "the top page lists its subcommands' pages: {top}");
        assert!(!top.contains("secret"), "hidden subcommands stay out of the man pages: {top}");
    }
}
