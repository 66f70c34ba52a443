//! The command line, compatible with the Go daemon:
//! `choria-provisioner [--debug] run --config FILE [--choria-config FILE] [--pid FILE]`,
//! `run` being the default command, plus `--version`, `--help` and kingpin's `help [COMMAND]`,
//! and fisk's `--no-debug`, `--help-long`, `--help-man` and completion flags. Flags take `--flag VALUE`
//! or `--flag=VALUE`, as Go's kingpin does. Ours alone: `helper-test`, which rehearses the
//! helper for one node, and `check-config`, which checks the configuration the way `run`
//! would load it (their flags follow the command word, as kingpin's command flags do).

use std::fmt;
use std::path::{Path, PathBuf};

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Run(RunArgs),
    HelperTest(HelperTestArgs),
    CheckConfig(CheckConfigArgs),
    Version,
    Help,
    /// fisk's hidden `--help-man`: the help as a man page.
    ManPage,
    /// fisk's hidden `--completion-script-bash` / `--completion-script-zsh`.
    CompletionScript(Shell),
    /// fisk's hidden `--completion-bash WORDS...`, which the completion scripts call: the
    /// words that may follow `WORDS`, one a line.
    Completions(Vec<String>),
}

/// A shell fisk writes a completion script for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shell {
    Bash,
    Zsh,
}

/// `check-config`: what to check, and how to print it. The files need not exist: a missing
/// one is part of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckConfigArgs {
    pub config: PathBuf,
    pub choria_config: PathBuf,
    /// Also connect to the brokers and check the election bucket.
    pub connect: bool,
    pub format: Format,
}

/// `helper-test`: what to rehearse, and how to print it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperTestArgs {
    pub config: PathBuf,
    /// Only when given or found at a default place: the rehearsal needs no broker.
    pub choria_config: Option<PathBuf>,
    pub identity: String,
    /// An `rpcutil#inventory` reply (its data, or the whole reply).
    pub inventory: Option<PathBuf>,
    pub csr: Option<PathBuf>,
    pub ed25519_pubkey: Option<String>,
    /// A provisioning JWT file.
    pub jwt: Option<PathBuf>,
    pub format: Format,
}

/// How `helper-test` and `check-config` print their report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunArgs {
    pub config: PathBuf,
    pub choria_config: PathBuf,
    pub pid: Option<PathBuf>,
    pub debug: bool,
}

/// A command line we cannot run; `main` prints it on one line and exits 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CliError {
    UnknownFlag(String),
    UnknownCommand(String),
    MissingValue(String),
    MissingConfig,
    NoSuchFile {
        flag: &'static str,
        path: PathBuf,
    },
    /// A required flag of a command.
    MissingFlag(&'static str),
    /// A flag value that is not one of the allowed ones.
    BadValue {
        flag: &'static str,
        value: String,
        allowed: &'static str,
    },
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::UnknownFlag(flag) => write!(f, "unknown flag {flag}, try --help"),
            CliError::UnknownCommand(cmd) => {
                write!(
                    f,
                    "unknown command {cmd:?}, the commands are run, check-config, helper-test and help; try --help"
                )
            }
            CliError::MissingValue(flag) => write!(f, "flag {flag} needs a value"),
            CliError::MissingConfig => write!(f, "required flag --config not provided, try --help"),
            CliError::NoSuchFile { flag, path } => {
                write!(f, "{flag}: file {} does not exist", path.display())
            }
            CliError::MissingFlag(flag) => {
                write!(f, "required flag {flag} not provided, try --help")
            }
            CliError::BadValue {
                flag,
                value,
                allowed,
            } => write!(f, "{flag}: {value:?} is not one of {allowed}"),
        }
    }
}

impl std::error::Error for CliError {}

/// `EX_CONFIG` from sysexits.h: the configuration is wrong, so starting again will not help
/// (the unit's `RestartPreventExitStatus=`). Go exits 1 for every failure.
pub const EXIT_CONFIG: i32 = 78;

/// Any other failure to run: systemd may restart us (`Restart=on-failure`).
pub const EXIT_FAILURE: i32 = 1;

/// A command line that cannot be used (`EX_USAGE`-like; Go's kingpin exits 1).
pub const EXIT_USAGE: i32 = 2;

impl CliError {
    /// [`EXIT_USAGE`], except a configuration file the command line names that does not
    /// exist: that is a configuration error (78, `EX_CONFIG`), which systemd does not retry.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::NoSuchFile {
                flag: "--config" | "--choria-config",
                ..
            } => EXIT_CONFIG,
            _ => EXIT_USAGE,
        }
    }
}

pub const USAGE: &str = "usage: choria-provisioner [--debug] [--version] [run] --config FILE [--choria-config FILE] [--pid FILE]
       choria-provisioner check-config --config FILE [--choria-config FILE] [--connect] [--format text|json]
       choria-provisioner helper-test --config FILE --identity NAME [...]

Choria Server provisioner

Flags:
  --help, help          Show this help
  --version             Show the version
  --debug               Log at debug level whatever the configuration says
  --no-debug            Undo an earlier --debug
  --help-man            Print this help as a man page
  --completion-script-bash, --completion-script-zsh
                        Print a shell completion script

Commands:
  run (default)         Run the provisioner
    --config FILE         The provisioner configuration (YAML)
    --choria-config FILE  The Choria client configuration; default: the first that exists of
                          ~/.choriarc, ~/.mcollective, /etc/choria/client.conf,
                          /usr/local/etc/choria/client.conf, else /etc/puppetlabs/mcollective/client.cfg
    --pid FILE            Write the process id to FILE, removed on exit
                        Exit 0 after SIGINT/SIGTERM; 78: configuration error (not retried by
                        systemd); 1: any other failure; 2: usage error

  check-config          Check the configuration as run would load it, offline, and print the
                        files, every effective setting (defaults marked), warnings, the
                        helper, keys and certificates, and the brokers; secrets show as set.
                        Exit 0: fine; 78: configuration error; 1: --connect failed;
                        2: usage error
    --config FILE         The provisioner configuration (YAML)
    --choria-config FILE  The Choria client configuration; default as for run
    --connect             Also connect to the brokers and check the election bucket
    --format text|json    How to print the report (default text)

  helper-test           Run the helper for one node as the daemon would, touching no node or
                        broker, and explain the decision. Exit 0: provisioned; 3: deferred or
                        shut down; 1: the node would fail; 2: usage error
    --config FILE         The provisioner configuration (YAML)
    --choria-config FILE  The Choria client configuration (checked when given)
    --identity NAME       The node to rehearse
    --inventory FILE      Its rpcutil#inventory reply (JSON); default: a minimal one
    --csr FILE            Its CSR (features.pki); default: a fresh one for the identity
    --ed25519-pubkey HEX  Its ed25519 public key (features.ed25519); default: a fresh one
    --jwt FILE            Its provisioning JWT (features.jwt), verified as the daemon does;
                          default: stand-in claims
    --format text|json    How to print the report (default text)
";

/// The Choria client config Go picks when `--choria-config` is not given.
pub fn default_choria_config(home: Option<&Path>, exists: &dyn Fn(&Path) -> bool) -> PathBuf {
    let mut candidates = Vec::new();
    if let Some(home) = home {
        candidates.push(home.join(".choriarc"));
        candidates.push(home.join(".mcollective"));
    }
    candidates.push(PathBuf::from("/etc/choria/client.conf"));
    candidates.push(PathBuf::from("/usr/local/etc/choria/client.conf"));
    candidates
        .into_iter()
        .find(|p| exists(p))
        .unwrap_or_else(|| PathBuf::from("/etc/puppetlabs/mcollective/client.cfg"))
}

/// The command line one flag at a time: `--flag value` or `--flag=value`.
struct Flags<'a> {
    iter: std::slice::Iter<'a, String>,
}

impl<'a> Flags<'a> {
    fn new(args: &'a [String]) -> Flags<'a> {
        Flags { iter: args.iter() }
    }

    /// The next argument, split into a flag and its inline `=value` (long flags only).
    fn next_flag(&mut self) -> Option<(&'a str, Option<String>)> {
        let arg = self.iter.next()?;
        Some(match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        })
    }

    /// The value of flag `name`: inline, else the next argument.
    fn value(&mut self, inline: &Option<String>, name: &str) -> Result<String, CliError> {
        match inline {
            Some(v) => Ok(v.clone()),
            None => self
                .iter
                .next()
                .cloned()
                .ok_or_else(|| CliError::MissingValue(name.to_string())),
        }
    }

    /// Everything not read yet (a subcommand's own arguments).
    fn rest(self) -> Vec<String> {
        self.iter.cloned().collect()
    }
}

/// Parses the arguments after the program name. `exists` decides whether a file exists.
pub fn parse(
    args: &[String],
    home: Option<&Path>,
    exists: &dyn Fn(&Path) -> bool,
) -> Result<Command, CliError> {
    // fisk's hidden flags act wherever they stand and whatever else the line holds: a
    // completion's words are a line still being typed.
    if let Some(at) = args.iter().position(|a| a == "--completion-bash") {
        let words = args.iter().enumerate().filter(|(i, _)| *i != at);
        return Ok(Command::Completions(
            words.map(|(_, w)| w.clone()).collect(),
        ));
    }
    for arg in args {
        match arg.as_str() {
            "--help-man" => return Ok(Command::ManPage),
            "--completion-script-bash" => return Ok(Command::CompletionScript(Shell::Bash)),
            "--completion-script-zsh" => return Ok(Command::CompletionScript(Shell::Zsh)),
            _ => {}
        }
    }
    let mut config = None;
    let mut choria_config = None;
    let mut pid = None;
    let mut debug = false;
    let mut seen_command = false;
    let mut flags = Flags::new(args);
    while let Some((flag, inline)) = flags.next_flag() {
        let mut value = |name: &str| flags.value(&inline, name);
        match flag {
            // fisk's `--help-long` prints every command's flags, which our help always does.
            "--help" | "-h" | "--help-long" => return Ok(Command::Help),
            "--version" => return Ok(Command::Version),
            "--debug" => debug = true,
            // fisk gives every boolean flag its negation; the last one given wins.
            "--no-debug" => debug = false,
            "--config" => config = Some(PathBuf::from(value("--config")?)),
            "--choria-config" => choria_config = Some(PathBuf::from(value("--choria-config")?)),
            "--pid" => pid = Some(PathBuf::from(value("--pid")?)),
            // kingpin's (fisk's) `help [COMMAND...]` command, which Go's daemon has.
            "help" if !seen_command => return Ok(Command::Help),
            "run" if !seen_command => seen_command = true,
            "helper-test" if !seen_command => {
                if pid.is_some() {
                    return Err(CliError::UnknownFlag("--pid".into()));
                }
                let rest = flags.rest();
                return parse_helper_test(&rest, config, choria_config, home, exists);
            }
            "check-config" if !seen_command => {
                if pid.is_some() {
                    return Err(CliError::UnknownFlag("--pid".into()));
                }
                let rest = flags.rest();
                return parse_check_config(&rest, config, choria_config, home, exists);
            }
            other if other.starts_with('-') => {
                return Err(CliError::UnknownFlag(other.to_string()))
            }
            other => return Err(CliError::UnknownCommand(other.to_string())),
        }
    }
    let config = config.ok_or(CliError::MissingConfig)?;
    if !exists(&config) {
        return Err(CliError::NoSuchFile {
            flag: "--config",
            path: config,
        });
    }
    let choria_config = match choria_config {
        Some(path) => path,
        None => default_choria_config(home, exists),
    };
    if !exists(&choria_config) {
        return Err(CliError::NoSuchFile {
            flag: "--choria-config",
            path: choria_config,
        });
    }
    Ok(Command::Run(RunArgs {
        config,
        choria_config,
        pid,
        debug,
    }))
}

/// The flags after `check-config`; `config` and `choria_config` may have come before it.
fn parse_check_config(
    args: &[String],
    mut config: Option<PathBuf>,
    mut choria_config: Option<PathBuf>,
    home: Option<&Path>,
    exists: &dyn Fn(&Path) -> bool,
) -> Result<Command, CliError> {
    let mut connect = false;
    let mut format = Format::Text;
    let mut flags = Flags::new(args);
    while let Some((flag, inline)) = flags.next_flag() {
        let mut value = |name: &str| flags.value(&inline, name);
        match flag {
            "--help" | "-h" | "--help-long" => return Ok(Command::Help),
            "--config" => config = Some(PathBuf::from(value("--config")?)),
            "--choria-config" => choria_config = Some(PathBuf::from(value("--choria-config")?)),
            "--connect" if inline.is_none() => connect = true,
            "--no-connect" if inline.is_none() => connect = false,
            "--format" => format = parse_format(&value("--format")?)?,
            other if other.starts_with('-') => {
                return Err(CliError::UnknownFlag(other.to_string()))
            }
            other => return Err(CliError::UnknownCommand(other.to_string())),
        }
    }
    let config = config.ok_or(CliError::MissingConfig)?;
    let choria_config = choria_config.unwrap_or_else(|| default_choria_config(home, exists));
    Ok(Command::CheckConfig(CheckConfigArgs {
        config,
        choria_config,
        connect,
        format,
    }))
}

fn parse_format(text: &str) -> Result<Format, CliError> {
    match text {
        "text" => Ok(Format::Text),
        "json" => Ok(Format::Json),
        other => Err(CliError::BadValue {
            flag: "--format",
            value: other.to_string(),
            allowed: "text, json",
        }),
    }
}

/// The flags after `helper-test`; `config` and `choria_config` may have come before it.
fn parse_helper_test(
    args: &[String],
    mut config: Option<PathBuf>,
    mut choria_config: Option<PathBuf>,
    home: Option<&Path>,
    exists: &dyn Fn(&Path) -> bool,
) -> Result<Command, CliError> {
    let mut identity = None;
    let mut inventory = None;
    let mut csr = None;
    let mut ed25519_pubkey = None;
    let mut jwt = None;
    let mut format = Format::Text;
    let mut flags = Flags::new(args);
    while let Some((flag, inline)) = flags.next_flag() {
        let mut value = |name: &str| flags.value(&inline, name);
        match flag {
            "--help" | "-h" | "--help-long" => return Ok(Command::Help),
            "--config" => config = Some(PathBuf::from(value("--config")?)),
            "--choria-config" => choria_config = Some(PathBuf::from(value("--choria-config")?)),
            "--identity" => identity = Some(value("--identity")?),
            "--inventory" => inventory = Some(PathBuf::from(value("--inventory")?)),
            "--csr" => csr = Some(PathBuf::from(value("--csr")?)),
            "--ed25519-pubkey" => ed25519_pubkey = Some(value("--ed25519-pubkey")?),
            "--jwt" => jwt = Some(PathBuf::from(value("--jwt")?)),
            "--format" => {
                format = match value("--format")?.as_str() {
                    "text" => Format::Text,
                    "json" => Format::Json,
                    other => {
                        return Err(CliError::BadValue {
                            flag: "--format",
                            value: other.to_string(),
                            allowed: "text, json",
                        })
                    }
                }
            }
            other if other.starts_with('-') => {
                return Err(CliError::UnknownFlag(other.to_string()))
            }
            other => return Err(CliError::UnknownCommand(other.to_string())),
        }
    }
    let config = config.ok_or(CliError::MissingConfig)?;
    let identity = identity
        .filter(|i| !i.is_empty())
        .ok_or(CliError::MissingFlag("--identity"))?;
    for (flag, path) in [
        ("--config", Some(&config)),
        ("--choria-config", choria_config.as_ref()),
        ("--inventory", inventory.as_ref()),
        ("--csr", csr.as_ref()),
        ("--jwt", jwt.as_ref()),
    ] {
        if let Some(path) = path {
            if !exists(path) {
                return Err(CliError::NoSuchFile {
                    flag,
                    path: path.clone(),
                });
            }
        }
    }
    // Without the flag, the daemon's default is checked only if one of its places has a file.
    let choria_config =
        choria_config.or_else(|| Some(default_choria_config(home, exists)).filter(|p| exists(p)));
    Ok(Command::HelperTest(HelperTestArgs {
        config,
        choria_config,
        identity,
        inventory,
        csr,
        ed25519_pubkey,
        jwt,
        format,
    }))
}

const COMMANDS: &[&str] = &["run", "check-config", "helper-test", "help"];
const GLOBAL_FLAGS: &[&str] = &["--help", "--version", "--debug", "--no-debug"];
const RUN_FLAGS: &[&str] = &["--config", "--choria-config", "--pid"];
const CHECK_CONFIG_FLAGS: &[&str] = &[
    "--config",
    "--choria-config",
    "--connect",
    "--no-connect",
    "--format",
];
const HELPER_TEST_FLAGS: &[&str] = &[
    "--config",
    "--choria-config",
    "--identity",
    "--inventory",
    "--csr",
    "--ed25519-pubkey",
    "--jwt",
    "--format",
];

/// What may follow `words` (the line typed so far, the last word perhaps half typed), as
/// fisk's completion answers: flags when the last word starts with `-`, the commands while
/// none is given, else the command's flags.
pub fn completions(words: &[String]) -> Vec<&'static str> {
    let command = words
        .iter()
        .find(|w| COMMANDS.contains(&w.as_str()))
        .map(String::as_str);
    let flags: Vec<&'static str> = match command {
        Some("check-config") => CHECK_CONFIG_FLAGS.to_vec(),
        Some("helper-test") => HELPER_TEST_FLAGS.to_vec(),
        Some("help") => Vec::new(),
        _ => GLOBAL_FLAGS.iter().chain(RUN_FLAGS).copied().collect(),
    };
    let last_is_flag = words.last().is_some_and(|w| w.starts_with('-'));
    match command {
        None if !last_is_flag => COMMANDS.to_vec(),
        Some("help") => COMMANDS.iter().copied().filter(|c| *c != "help").collect(),
        _ => flags,
    }
}

/// `--completion-script-bash`: asks the binary for the words (`--completion-bash`), as
/// fisk's script does, so that it stays true of whatever version is installed.
pub const BASH_COMPLETION: &str = r#"_choria_provisioner_complete() {
    local cur="${COMP_WORDS[COMP_CWORD]}"
    local words
    words=$("${COMP_WORDS[0]}" --completion-bash "${COMP_WORDS[@]:1:$COMP_CWORD}")
    COMPREPLY=( $(compgen -W "${words}" -- "${cur}") )
    return 0
}
complete -F _choria_provisioner_complete -o default choria-provisioner
"#;

/// `--completion-script-zsh`: the same question from zsh.
pub const ZSH_COMPLETION: &str = r#"#compdef choria-provisioner

_choria_provisioner() {
    local -a words_typed completions
    words_typed=("${(@)words[2,$CURRENT]}")
    completions=("${(@f)$("${words[1]}" --completion-bash "${(@)words_typed}")}")
    compadd -- "${(@)completions}"
}

if [[ "$(basename -- ${(%):-%x})" != "_choria-provisioner" ]]; then
    compdef _choria_provisioner choria-provisioner
fi
"#;

/// `--help-man`: the help as a man(7) page.
pub fn man_page(version: &str) -> String {
    let mut page = format!(
        ".TH choria-provisioner 1 \"\" \"choria-provisioner {version}\" \"User Commands\"\n\
         .SH NAME\nchoria-provisioner \\- Choria Server provisioner\n\
         .SH SYNOPSIS\n.nf\n"
    );
    for line in USAGE.lines() {
        // A roff line starting with `.` or `'` is a request; `\` starts an escape.
        let line = line.replace('\\', "\\e");
        if line.starts_with('.') || line.starts_with('\'') {
            page.push_str("\\&");
        }
        page.push_str(&line);
        page.push('\n');
    }
    page.push_str(".fi\n");
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    fn run(
        config: &str,
        choria: &str,
        pid: Option<&str>,
        debug: bool,
    ) -> Result<Command, CliError> {
        Ok(Command::Run(RunArgs {
            config: config.into(),
            choria_config: choria.into(),
            pid: pid.map(PathBuf::from),
            debug,
        }))
    }

    #[test]
    fn completes_commands_then_the_commands_flags() {
        let cases: &[(&str, &[&str], &[&str])] = &[
            ("", &["run", "check-config", "helper-test"], &["--pid"]),
            ("--de", &["--debug", "--no-debug", "--config"], &["run"]),
            ("run", &["--config", "--pid", "--debug"], &["run", "--jwt"]),
            (
                "check-config --config p.yaml",
                &["--connect", "--no-connect", "--format"],
                &["--pid", "--identity", "run"],
            ),
            ("helper-test", &["--identity", "--jwt"], &["--pid"]),
            ("help", &["run", "check-config"], &["help", "--config"]),
        ];
        for (line, has, lacks) in cases {
            let got = completions(&args(line));
            for word in *has {
                assert!(got.contains(word), "{line:?}: {word} not in {got:?}");
            }
            for word in *lacks {
                assert!(!got.contains(word), "{line:?}: {word} in {got:?}");
            }
        }
    }

    #[test]
    fn the_man_page_escapes_roff() {
        let page = man_page("9.9.9");
        assert!(page.starts_with(".TH choria-provisioner 1 "), "{page}");
        assert!(page.contains("choria-provisioner 9.9.9"), "{page}");
        assert!(page.contains("--choria-config FILE"), "{page}");
        // Between .nf and .fi, no line of the help may read as a roff request.
        let requests = page
            .lines()
            .skip_while(|l| *l != ".nf")
            .skip(1)
            .take_while(|l| *l != ".fi")
            .filter(|l| l.starts_with('.') || l.starts_with('\''))
            .count();
        assert_eq!(requests, 0, "{page}");
        assert!(page.ends_with(".fi\n"), "{page}");
    }

    #[test]
    fn parses_like_the_go_daemon() {
        let exists = |p: &Path| !p.to_string_lossy().contains("missing");
        let home = Path::new("/home/u");
        let cases: Vec<(&str, Result<Command, CliError>)> = vec![
            (
                "run --config p.yaml --choria-config c.cfg",
                run("p.yaml", "c.cfg", None, false),
            ),
            (
                "--config p.yaml --choria-config c.cfg",
                run("p.yaml", "c.cfg", None, false),
            ),
            (
                "--debug run --config=p.yaml --pid /run/p.pid --choria-config=c.cfg",
                run("p.yaml", "c.cfg", Some("/run/p.pid"), true),
            ),
            (
                "run --config p.yaml --debug",
                run("p.yaml", "/home/u/.choriarc", None, true),
            ),
            ("--version", Ok(Command::Version)),
            ("help", Ok(Command::Help)),
            ("help run", Ok(Command::Help)),
            ("--debug help check-config", Ok(Command::Help)),
            ("run --help", Ok(Command::Help)),
            // fisk's own flags, which Go's daemon accepts.
            (
                "--debug run --config p.yaml --no-debug",
                run("p.yaml", "/home/u/.choriarc", None, false),
            ),
            (
                "--no-debug run --config p.yaml --debug",
                run("p.yaml", "/home/u/.choriarc", None, true),
            ),
            ("--help-long", Ok(Command::Help)),
            ("run --help-long", Ok(Command::Help)),
            ("check-config --help-long", Ok(Command::Help)),
            ("--help-man", Ok(Command::ManPage)),
            ("run --config --help-man", Ok(Command::ManPage)),
            (
                "--completion-script-bash",
                Ok(Command::CompletionScript(Shell::Bash)),
            ),
            (
                "--completion-script-zsh",
                Ok(Command::CompletionScript(Shell::Zsh)),
            ),
            (
                "check-config --completion-bash --con",
                Ok(Command::Completions(args("check-config --con"))),
            ),
            ("--completion-bash", Ok(Command::Completions(Vec::new()))),
            (
                "run --config p.yaml --frobnicate",
                Err(CliError::UnknownFlag("--frobnicate".into())),
            ),
            (
                "walk --config p.yaml",
                Err(CliError::UnknownCommand("walk".into())),
            ),
            (
                "run run --config p.yaml",
                Err(CliError::UnknownCommand("run".into())),
            ),
            (
                "run --config",
                Err(CliError::MissingValue("--config".into())),
            ),
            ("run", Err(CliError::MissingConfig)),
            (
                "run --config missing.yaml",
                Err(CliError::NoSuchFile {
                    flag: "--config",
                    path: "missing.yaml".into(),
                }),
            ),
            (
                "run --config p.yaml --choria-config missing.cfg",
                Err(CliError::NoSuchFile {
                    flag: "--choria-config",
                    path: "missing.cfg".into(),
                }),
            ),
        ];
        for (line, want) in cases {
            assert_eq!(parse(&args(line), Some(home), &exists), want, "{line}");
        }
    }

    #[test]
    fn helper_test_takes_its_flags_after_the_command() {
        let exists = |p: &Path| !p.to_string_lossy().contains("missing");
        let none = |p: &Path| p == Path::new("p.yaml");
        let home = Path::new("/h");
        let rehearsal = |choria: Option<&str>, inventory: Option<&str>, format: Format| {
            Ok(Command::HelperTest(HelperTestArgs {
                config: "p.yaml".into(),
                choria_config: choria.map(PathBuf::from),
                identity: "n1.example.net".into(),
                inventory: inventory.map(PathBuf::from),
                csr: None,
                ed25519_pubkey: None,
                jwt: None,
                format,
            }))
        };
        let cases: Vec<(&str, Result<Command, CliError>)> = vec![
            (
                "helper-test --config p.yaml --identity n1.example.net --choria-config c.cfg",
                rehearsal(Some("c.cfg"), None, Format::Text),
            ),
            (
                "--config p.yaml helper-test --identity=n1.example.net --inventory i.json --format json",
                rehearsal(Some("/h/.choriarc"), Some("i.json"), Format::Json),
            ),
            (
                "helper-test --config p.yaml --identity n1.example.net --format yaml",
                Err(CliError::BadValue {
                    flag: "--format",
                    value: "yaml".into(),
                    allowed: "text, json",
                }),
            ),
            (
                "helper-test --config p.yaml",
                Err(CliError::MissingFlag("--identity")),
            ),
            (
                "helper-test --identity n1",
                Err(CliError::MissingConfig),
            ),
            (
                "helper-test --config p.yaml --identity n1 --csr missing.pem",
                Err(CliError::NoSuchFile {
                    flag: "--csr",
                    path: "missing.pem".into(),
                }),
            ),
            (
                "helper-test --config p.yaml --identity n1 --pid x.pid",
                Err(CliError::UnknownFlag("--pid".into())),
            ),
            (
                "--identity n1 helper-test --config p.yaml",
                Err(CliError::UnknownFlag("--identity".into())),
            ),
            (
                "run helper-test --config p.yaml",
                Err(CliError::UnknownCommand("helper-test".into())),
            ),
        ];
        for (line, want) in cases {
            assert_eq!(parse(&args(line), Some(home), &exists), want, "{line}");
        }
        // No --choria-config and none at the default places: none is checked.
        assert_eq!(
            parse(
                &args("helper-test --config p.yaml --identity n1.example.net"),
                Some(home),
                &none
            ),
            rehearsal(None, None, Format::Text)
        );
    }

    #[test]
    fn check_config_takes_its_flags_after_the_command_and_checks_no_file() {
        let none = |_: &Path| false;
        let home = Path::new("/h");
        let check = |choria: &str, connect: bool, format: Format| {
            Ok(Command::CheckConfig(CheckConfigArgs {
                config: "p.yaml".into(),
                choria_config: choria.into(),
                connect,
                format,
            }))
        };
        let cases: Vec<(&str, Result<Command, CliError>)> = vec![
            (
                "check-config --config p.yaml --choria-config c.cfg",
                check("c.cfg", false, Format::Text),
            ),
            (
                "--config=p.yaml check-config --connect --format=json",
                check("/etc/puppetlabs/mcollective/client.cfg", true, Format::Json),
            ),
            ("check-config", Err(CliError::MissingConfig)),
            (
                "check-config --config p.yaml --connect=yes",
                Err(CliError::UnknownFlag("--connect".into())),
            ),
            (
                "check-config --config p.yaml --pid x",
                Err(CliError::UnknownFlag("--pid".into())),
            ),
            (
                "run check-config --config p.yaml",
                Err(CliError::UnknownCommand("check-config".into())),
            ),
        ];
        for (line, want) in cases {
            assert_eq!(parse(&args(line), Some(home), &none), want, "{line}");
        }
    }

    #[test]
    fn a_missing_configuration_file_exits_78_other_usage_errors_2() {
        let missing = |flag| CliError::NoSuchFile {
            flag,
            path: "x".into(),
        };
        assert_eq!(missing("--config").exit_code(), 78);
        assert_eq!(missing("--choria-config").exit_code(), 78);
        assert_eq!(missing("--csr").exit_code(), 2);
        assert_eq!(CliError::MissingConfig.exit_code(), 2);
        assert_eq!(CliError::UnknownFlag("--x".into()).exit_code(), 2);
    }

    #[test]
    fn choria_config_defaults_in_go_order() {
        let only = |present: &'static str| move |p: &Path| p == Path::new(present);
        let home = Some(Path::new("/h"));
        let cases = [
            ("/h/.choriarc", "/h/.choriarc"),
            ("/h/.mcollective", "/h/.mcollective"),
            ("/etc/choria/client.conf", "/etc/choria/client.conf"),
            (
                "/usr/local/etc/choria/client.conf",
                "/usr/local/etc/choria/client.conf",
            ),
            ("/nowhere", "/etc/puppetlabs/mcollective/client.cfg"),
        ];
        for (present, want) in cases {
            assert_eq!(
                default_choria_config(home, &only(present)),
                PathBuf::from(want),
                "{present}"
            );
        }
        let all = |_: &Path| true;
        assert_eq!(
            default_choria_config(home, &all),
            PathBuf::from("/h/.choriarc")
        );
        assert_eq!(
            default_choria_config(None, &all),
            PathBuf::from("/etc/choria/client.conf")
        );
    }
}
