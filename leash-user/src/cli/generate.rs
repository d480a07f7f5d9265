//! What is generated from the clap definitions: the version string, shell completions and the
//! manual pages (`cargo xtask install` runs the last two on the binary it installs).

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::{Context, Result};
use clap::{Args, CommandFactory, ValueEnum};

/// `leash --version`: the release, the commit it was built from (`-dirty` if the tree had
/// changes, `unknown` if built outside a git checkout) and the ABI of the pins it reads and
/// writes (a daemon takes over only the pins of its own ABI).
pub(super) const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("LEASH_COMMIT"),
    ", pins ABI v",
    env!("LEASH_ABI"),
    ")"
);

#[derive(Args, Debug)]
pub(super) struct CompletionsArgs {
    /// The shell to complete for.
    shell: Shell,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Args, Debug)]
pub(super) struct ManpagesArgs {
    /// The directory to write them to (made if missing).
    dir: PathBuf,
}

/// Prints the completion script for a shell.
pub(super) fn completions(args: CompletionsArgs) -> Result<ExitCode> {
    let shell = match args.shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut super::Cli::command(), "leash", &mut script);
    let mut stdout = super::stdout::lock();
    stdout.write_all(&script)?;
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Writes leash.1 and a page for every subcommand shown in `--help` (leash-run.1, ...).
pub(super) fn manpages(args: ManpagesArgs) -> Result<ExitCode> {
    std::fs::create_dir_all(&args.dir).with_context(|| format!("making {}", args.dir.display()))?;
    let mut cli = for_man(super::Cli::command().disable_help_subcommand(true));
    // Gives every subcommand its display name ("leash-run"), which names its page.
    cli.build();
    let mut out = super::stdout::lock();
    for page in pages(&cli, &args.dir)? {
        writeln!(out, "{}", page.display())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A command, and its subcommands, with the first clause of their about as the NAME line's
/// summary ("leash-run - Run CMD on a leash"); the whole text stays in DESCRIPTION.
fn for_man(mut cmd: clap::Command) -> clap::Command {
    if let Some(about) = cmd.get_about().map(ToString::to_string) {
        if cmd.get_long_about().is_none() {
            cmd = cmd.long_about(about.clone());
        }
        cmd = cmd.about(summary(&about));
    }
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    for name in names {
        cmd = cmd.mut_subcommand(name, for_man);
    }
    cmd
}

/// The text up to the first ": ", "; " or ". " outside parentheses, without a final period.
fn summary(about: &str) -> String {
    let mut depth = 0usize;
    let mut chars = about.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ':' | ';' | '.'
                if depth == 0 && chars.peek().is_none_or(|&(_, next)| next.is_whitespace()) =>
            {
                return about[..at].to_owned();
            }
            _ => {}
        }
    }
    about.to_owned()
}

fn pages(cmd: &clap::Command, dir: &Path) -> Result<Vec<PathBuf>> {
    let man = clap_mangen::Man::new(cmd.clone())
        .source(format!("leash {}", env!("CARGO_PKG_VERSION")))
        .manual("leash manual");
    let path = man
        .generate_to(dir)
        .with_context(|| format!("writing {} in {}", man.get_filename(), dir.display()))?;
    let mut written = vec![path];
    for sub in cmd.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        written.extend(pages(sub, dir)?);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::summary;

    #[test]
    fn a_summary_is_the_first_clause_outside_parentheses() {
        assert_eq!(
            summary("Run CMD on a leash: when CMD exits, the rest is killed."),
            "Run CMD on a leash"
        );
        assert_eq!(
            summary("List the trees (yours; all of them for root)"),
            "List the trees (yours; all of them for root)"
        );
        assert_eq!(
            summary("Keeps agents on a leash. An eBPF program"),
            "Keeps agents on a leash"
        );
        assert_eq!(summary("Kill a tree."), "Kill a tree");
        assert_eq!(summary("version 0.1.0"), "version 0.1.0");
    }

    #[test]
    fn the_version_names_the_pins_abi() {
        assert_eq!(env!("LEASH_ABI"), leash_common::ABI_VERSION.to_string());
        assert!(super::VERSION.contains(&format!("pins ABI v{}", leash_common::ABI_VERSION)));
    }
}
