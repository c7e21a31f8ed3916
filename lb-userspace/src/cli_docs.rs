//! Man pages and shell completions of `lbd` and `lbctl`, written by their
//! hidden `__generate` subcommand when the Debian package is built
//! (`cargo xtask package`).

use std::{io, path::Path};

use clap_complete::Shell;

/// `__generate`: what to write.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Generated {
    /// A section 8 man page per command and subcommand.
    Man,
    /// bash, zsh and fish completions.
    Completions,
}

/// Writes the man pages or completions of `full` (a binary's whole
/// command line), named `name`, into `dir`.
pub fn generate(
    full: clap::Command,
    name: &'static str,
    what: Generated,
    dir: &Path,
) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let full = full.name(name).disable_help_subcommand(true);
    match what {
        Generated::Man => {
            let mut built = full;
            built.build();
            write_man(&built, dir)
        }
        Generated::Completions => {
            // clap_complete ignores `hide`: the same command without
            // `__generate`.
            let visible = clap::Command::new(name)
                .version(env!("CARGO_PKG_VERSION"))
                .about(full.get_about().cloned().unwrap_or_default())
                .disable_help_subcommand(true)
                .args(full.get_arguments().cloned())
                .subcommands(full.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
            for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
                clap_complete::generate_to(shell, &mut visible.clone(), name, dir)?;
            }
            Ok(())
        }
    }
}

/// One page for `cmd` and one per visible subcommand, recursively.
fn write_man(cmd: &clap::Command, dir: &Path) -> io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_man(sub, dir)?;
    }
    clap_mangen::Man::new(cmd.clone())
        .section("8")
        .generate_to(dir)
        .map_err(|e| {
            let what = format!("writing the man page of {}: {e}", cmd.get_name());
            io::Error::new(e.kind(), what)
        })?;
    Ok(())
}

/// What an operator would trip over in `cmd`'s help and man pages, every
/// visible command and argument down the tree: a missing one-line
/// description, or a Rust documentation artefact in one (backticks,
/// `→`, intra-doc links). Each problem names its command path.
pub fn doc_problems(cmd: &clap::Command) -> Vec<String> {
    let mut cmd = cmd.clone();
    cmd.build();
    let mut problems = Vec::new();
    walk(&cmd, cmd.get_name(), &mut problems);
    problems
}

/// The visible leaf commands of `cmd`, as `vip add`, `status`.
pub fn leaf_commands(cmd: &clap::Command) -> Vec<String> {
    fn leaves(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        let subs: Vec<_> = cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
            .collect();
        if subs.is_empty() && !path.is_empty() {
            out.push(path.to_string());
        }
        for s in subs {
            let p = if path.is_empty() {
                s.get_name().to_string()
            } else {
                format!("{path} {}", s.get_name())
            };
            leaves(s, &p, out);
        }
    }
    let mut out = Vec::new();
    leaves(cmd, "", &mut out);
    out
}

fn artefact(text: &str) -> Option<&'static str> {
    [
        ("`", "a backtick"),
        ("→", "an arrow"),
        ("[`", "an intra-doc link"),
        ("super::", "a Rust path"),
        ("crate::", "a Rust path"),
    ]
    .into_iter()
    .find(|(needle, _)| text.contains(needle))
    .map(|(_, what)| what)
}

fn walk(cmd: &clap::Command, path: &str, problems: &mut Vec<String>) {
    let about = cmd.get_about().map(ToString::to_string).unwrap_or_default();
    let long = cmd
        .get_long_about()
        .map(ToString::to_string)
        .unwrap_or_default();
    if about.trim().is_empty() {
        problems.push(format!("{path}: no description"));
    }
    for text in [&about, &long] {
        if let Some(what) = artefact(text) {
            problems.push(format!("{path}: {what} in {text:?}"));
        }
    }
    for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        let id = arg.get_id().as_str();
        if id == "help" || id == "version" {
            continue;
        }
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        let long = arg
            .get_long_help()
            .map(ToString::to_string)
            .unwrap_or_default();
        if help.trim().is_empty() && long.trim().is_empty() {
            problems.push(format!("{path} <{id}>: no description"));
        }
        for text in [&help, &long] {
            if let Some(what) = artefact(text) {
                problems.push(format!("{path} <{id}>: {what} in {text:?}"));
            }
        }
    }
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        walk(sub, &format!("{path} {}", sub.get_name()), problems);
    }
}

/// Every man page of `cmd`, rendered as `write_man` would write them.
pub fn render_man_pages(cmd: &clap::Command) -> io::Result<Vec<(String, String)>> {
    fn render(cmd: &clap::Command, out: &mut Vec<(String, String)>) -> io::Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            render(sub, out)?;
        }
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd.clone())
            .section("8")
            .render(&mut page)?;
        out.push((
            cmd.get_display_name().unwrap_or(cmd.get_name()).to_string(),
            String::from_utf8_lossy(&page).into_owned(),
        ));
        Ok(())
    }
    let mut built = cmd.clone().disable_help_subcommand(true);
    built.build();
    let mut out = Vec::new();
    render(&built, &mut out)?;
    Ok(out)
}
