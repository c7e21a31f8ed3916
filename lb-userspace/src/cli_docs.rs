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
