//! `HelperCommand`: the `helper` setting split into a program and its arguments.

use std::fmt;

/// The `helper` setting split with shell quoting rules (as Go's go-shellquote since provisioner
/// #214): `/usr/bin/helper --ca "/etc/my ca"` is a program and two arguments. Never empty.
/// `Debug` shows the program and how many arguments follow, never the arguments.
#[derive(Clone, PartialEq, Eq)]
pub struct HelperCommand {
    words: Vec<String>,
}

impl fmt::Debug for HelperCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HelperCommand")
            .field("program", &self.program())
            .field("arguments", &self.args().len())
            .finish()
    }
}

impl HelperCommand {
    /// Splits a command line; the error says why it cannot be.
    pub fn parse(line: &str) -> Result<HelperCommand, String> {
        let words = shlex::split(line).ok_or_else(|| {
            "cannot split the helper command: unbalanced quotes or a trailing backslash".to_string()
        })?;
        if words.is_empty() {
            return Err("cannot split the helper command: it names no program".to_string());
        }
        Ok(HelperCommand { words })
    }

    /// The program, which names the helper in messages (its arguments may hold secrets).
    pub fn program(&self) -> &str {
        &self.words[0]
    }

    pub fn args(&self) -> &[String] {
        &self.words[1..]
    }
}
