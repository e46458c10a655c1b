//! `ustack-docgen ROOT`: the man pages and shell completions of `ustack`,
//! `uping`, `uperf` and `utop`, made from the clap definitions the
//! binaries parse (`ustack_apps::cli`, `utop::cli`), written under ROOT
//! where Debian keeps them:
//!
//! ```text
//! ROOT/usr/share/man/man1/NAME.1 (and ustack-run.1, ... per subcommand)
//! ROOT/usr/share/bash-completion/completions/NAME
//! ROOT/usr/share/zsh/vendor-completions/_NAME
//! ROOT/usr/share/fish/vendor_completions.d/NAME.fish
//! ```
//!
//! Build it with the features the packaged binaries have: flags of
//! backends a build lacks are hidden from `--help`, and so from the pages.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::CommandFactory;
use clap_complete::Shell;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(root), None) = (args.next(), args.next()) else {
        eprintln!("usage: ustack-docgen ROOT");
        return ExitCode::from(2);
    };
    match generate(Path::new(&root)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ustack-docgen: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Every page and completion file under `root`.
fn generate(root: &Path) -> Result<()> {
    let commands = [
        ustack_apps::cli::ustack::Cli::command(),
        ustack_apps::cli::uping::Cli::command(),
        ustack_apps::cli::uperf::Cli::command(),
        utop::cli::Cli::command(),
    ];
    let dir = |p: &str| -> Result<PathBuf> {
        let d = root.join(p);
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        Ok(d)
    };
    let man = dir("usr/share/man/man1")?;
    let completions = [
        (Shell::Bash, dir("usr/share/bash-completion/completions")?),
        (Shell::Zsh, dir("usr/share/zsh/vendor-completions")?),
        (Shell::Fish, dir("usr/share/fish/vendor_completions.d")?),
    ];
    for mut cmd in commands {
        let name = cmd.get_name().to_string();
        // NAME.1, and NAME-SUB.1 for each subcommand.
        clap_mangen::generate_to(cmd.clone(), &man)
            .with_context(|| format!("writing the man pages of {name}"))?;
        for (shell, dir) in &completions {
            let file = clap_complete::generate_to(*shell, &mut cmd, &name, dir)
                .with_context(|| format!("writing the {shell} completion of {name}"))?;
            // bash-completion looks a command's completion up by its name.
            if *shell == Shell::Bash {
                std::fs::rename(&file, dir.join(&name))
                    .with_context(|| format!("renaming {}", file.display()))?;
            }
        }
    }
    Ok(())
}
