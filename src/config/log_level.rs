//! `LogLevel`: the `loglevel` names Go's logrus accepts.

/// `loglevel`: the names Go's logrus accepts, each mapped to the nearest level we log at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    /// Every accepted name, in order of verbosity (`fatal` logs errors: we have no fatal
    /// level). Go's `SetupLogging` takes debug, info, warn, error and fatal; anything else
    /// (`panic` too) is warn there and here.
    const NAMES: [(&'static str, LogLevel); 7] = [
        ("trace", LogLevel::Trace),
        ("debug", LogLevel::Debug),
        ("info", LogLevel::Info),
        ("warn", LogLevel::Warn),
        ("warning", LogLevel::Warn),
        ("error", LogLevel::Error),
        ("fatal", LogLevel::Error),
    ];

    /// The level a name selects, case-insensitively.
    pub fn parse(name: &str) -> Option<LogLevel> {
        LogLevel::NAMES
            .iter()
            .find(|(known, _)| known.eq_ignore_ascii_case(name))
            .map(|(_, level)| *level)
    }

    /// What the `log` crate filters at.
    pub fn filter(self) -> log::LevelFilter {
        match self {
            LogLevel::Trace => log::LevelFilter::Trace,
            LogLevel::Debug => log::LevelFilter::Debug,
            LogLevel::Info => log::LevelFilter::Info,
            LogLevel::Warn => log::LevelFilter::Warn,
            LogLevel::Error => log::LevelFilter::Error,
        }
    }

    pub(super) fn names() -> String {
        let names: Vec<&str> = LogLevel::NAMES.iter().map(|(name, _)| *name).collect();
        names.join(", ")
    }
}
