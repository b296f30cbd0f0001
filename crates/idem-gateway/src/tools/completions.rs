//! `idem completions SHELL`: a completion script for the shell, written from the command
//! line's own definition, so it offers every subcommand and flag `idem` has.
//!
//! ```sh
//! idem completions bash > /usr/share/bash-completion/completions/idem
//! idem completions zsh  > /usr/share/zsh/vendor-completions/_idem
//! idem completions fish > /usr/share/fish/vendor_completions.d/idem.fish
//! ```

use clap::CommandFactory;

pub(crate) use clap_complete::Shell;

use crate::cli::Cli;

/// The completion script of `idem` for `shell`.
pub(crate) fn script(shell: Shell) -> Vec<u8> {
    let mut cmd = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "idem", &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shell_has_a_script_naming_the_subcommands() {
        for shell in [
            Shell::Bash,
            Shell::Zsh,
            Shell::Fish,
            Shell::Elvish,
            Shell::PowerShell,
        ] {
            let text = String::from_utf8(script(shell)).unwrap();
            for word in ["serve", "check-config", "upstream", "completions"] {
                assert!(text.contains(word), "{shell}: no {word}");
            }
        }
    }
}
