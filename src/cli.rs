//! The command line, compatible with the Go daemon:
//! `choria-provisioner [--debug] run --config FILE [--choria-config FILE] [--pid FILE]`,
//! `run` being the default command, plus `--version` and `--help`. Flags take `--flag VALUE`
//! or `--flag=VALUE`, as Go's kingpin does.

use std::fmt;
use std::path::{Path, PathBuf};

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Run(RunArgs),
    Version,
    Help,
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
    NoSuchFile { flag: &'static str, path: PathBuf },
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::UnknownFlag(flag) => write!(f, "unknown flag {flag}, try --help"),
            CliError::UnknownCommand(cmd) => {
                write!(
                    f,
                    "unknown command {cmd:?}, the only command is run; try --help"
                )
            }
            CliError::MissingValue(flag) => write!(f, "flag {flag} needs a value"),
            CliError::MissingConfig => write!(f, "required flag --config not provided, try --help"),
            CliError::NoSuchFile { flag, path } => {
                write!(f, "{flag}: file {} does not exist", path.display())
            }
        }
    }
}

impl std::error::Error for CliError {}

pub const USAGE: &str = "usage: choria-provisioner [--debug] [--version] [run] --config FILE [--choria-config FILE] [--pid FILE]

Choria Server provisioner

Flags:
  --help                Show this help
  --version             Show the version
  --debug               Log at debug level whatever the configuration says

Commands:
  run (default)         Run the provisioner
    --config FILE         The provisioner configuration (YAML)
    --choria-config FILE  The Choria client configuration; default: the first that exists of
                          ~/.choriarc, ~/.mcollective, /etc/choria/client.conf,
                          /usr/local/etc/choria/client.conf, else /etc/puppetlabs/mcollective/client.cfg
    --pid FILE            Write the process id to FILE, removed on exit
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

/// Parses the arguments after the program name. `exists` decides whether a file exists.
pub fn parse(
    args: &[String],
    home: Option<&Path>,
    exists: &dyn Fn(&Path) -> bool,
) -> Result<Command, CliError> {
    let mut config = None;
    let mut choria_config = None;
    let mut pid = None;
    let mut debug = false;
    let mut seen_command = false;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = |name: &str| -> Result<String, CliError> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => iter
                    .next()
                    .cloned()
                    .ok_or_else(|| CliError::MissingValue(name.to_string())),
            }
        };
        match flag {
            "--help" | "-h" => return Ok(Command::Help),
            "--version" => return Ok(Command::Version),
            "--debug" => debug = true,
            "--config" => config = Some(PathBuf::from(value("--config")?)),
            "--choria-config" => choria_config = Some(PathBuf::from(value("--choria-config")?)),
            "--pid" => pid = Some(PathBuf::from(value("--pid")?)),
            "run" if !seen_command => seen_command = true,
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
            ("run --help", Ok(Command::Help)),
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
