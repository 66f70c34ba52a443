//! The `cert_deny_list`: Go's patterns and rules (provisioner host/host.go, validateCSR), with
//! names also read lowercased and without one trailing dot.

use std::fmt;

/// The deny list used when `cert_deny_list` is empty (Go `config/config.go`; the second `.`
/// in the first two is unescaped there too).
pub const DEFAULT_DENY_PATTERNS: [&str; 4] = [
    r"\.privileged.mcollective$",
    r"\.privileged.choria$",
    r"\.mcollective$",
    r"\.choria$",
];

/// One deny-list entry: the text as configured, and its compiled regex.
#[derive(Debug, Clone)]
struct DenyPattern {
    configured: String,
    regex: regex::Regex,
}

/// A `cert_deny_list` entry that is not a regular expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenyListError {
    /// The entry as configured.
    pub entry: String,
    /// The regular expression compiler's reason.
    pub reason: String,
}

impl fmt::Display for DenyListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "entry {:?} is not a valid regular expression: {}",
            self.entry, self.reason
        )
    }
}

impl std::error::Error for DenyListError {}

/// The compiled `cert_deny_list`, with Go's defaults when the configured list is empty.
#[derive(Debug, Clone)]
pub struct DenyList {
    patterns: Vec<DenyPattern>,
}

impl DenyList {
    /// Compiles `patterns` once; an empty slice selects [`DEFAULT_DENY_PATTERNS`]. An entry
    /// that does not compile refuses the list (Go would keep it and never match it).
    pub fn new(patterns: &[String]) -> Result<DenyList, DenyListError> {
        let configured: Vec<String> = if patterns.is_empty() {
            DEFAULT_DENY_PATTERNS
                .iter()
                .map(|p| p.to_string())
                .collect()
        } else {
            patterns.to_vec()
        };
        let patterns = configured
            .into_iter()
            .map(|entry| match regex::Regex::new(strip_slashes(&entry)) {
                Ok(regex) => Ok(DenyPattern {
                    configured: entry,
                    regex,
                }),
                Err(err) => Err(DenyListError {
                    entry,
                    reason: err.to_string(),
                }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(DenyList { patterns })
    }

    /// The configured entry that `name` matches, if any: `name` as it is, or lowercased without
    /// one trailing dot ([`normalised_name`]), so neither case nor the root dot hides a name
    /// (Go matches the name as it is only). A pattern written in capitals still matches the
    /// name as written.
    pub(crate) fn matching_pattern(&self, name: &str) -> Option<&str> {
        let normalised = normalised_name(name);
        self.patterns
            .iter()
            .find(|p| p.regex.is_match(name) || p.regex.is_match(&normalised))
            .map(|p| p.configured.as_str())
    }

    /// The entries in force, as configured (the defaults when none were).
    pub fn entries(&self) -> impl Iterator<Item = &str> {
        self.patterns.iter().map(|p| p.configured.as_str())
    }
}

/// A name as the deny list also reads it: lowercased, without one trailing dot.
pub(crate) fn normalised_name(name: &str) -> String {
    let name = name.strip_suffix('.').unwrap_or(name);
    name.to_lowercase()
}

/// Go: an entry matching `^/.+/$` has all leading and all trailing `/` trimmed (`TrimLeft` and
/// `TrimRight` with cutset `/`).
fn strip_slashes(entry: &str) -> &str {
    if entry.len() >= 3 && entry.starts_with('/') && entry.ends_with('/') {
        entry.trim_start_matches('/').trim_end_matches('/')
    } else {
        entry
    }
}
