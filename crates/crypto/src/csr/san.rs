//! Subject alternative names as the CSR and certificate checks read them: DNS names, and the
//! other kinds `cert_allowed_san_kinds` may allow.

use std::fmt;

use choria_wire::text::escape;
use x509_parser::extensions::GeneralName;

/// Whether a DNS name has an empty label once one trailing dot is removed (`a..b`, `.a`,
/// `a..`, empty): no host is named so, and a name matched against the deny list must be one.
pub(crate) fn has_empty_label(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    name.split('.').any(str::is_empty)
}

/// A kind of subject alternative name other than DNS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SanKind {
    Ip,
    Uri,
    Email,
    /// otherName, directoryName, x400Address, ediPartyName or registeredID (named): nothing in
    /// Choria uses them, so no setting allows them.
    Unusual(&'static str),
}

impl SanKind {
    /// As `openssl x509 -text` names it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            SanKind::Ip => "IP",
            SanKind::Uri => "URI",
            SanKind::Email => "email",
            SanKind::Unusual(name) => name,
        }
    }
}

/// A subject alternative name other than DNS, as an operator reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherSan {
    pub(crate) kind: SanKind,
    /// The value as text (an IP address, a URI, an address; a description for the rest).
    pub(crate) value: String,
}

/// The refusal of a SAN, shared by CSR and certificate errors.
pub(crate) struct RefusedSanText<'a>(pub(crate) &'a OtherSan);

impl fmt::Display for RefusedSanText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let san = self.0;
        match san.kind {
            SanKind::Unusual(name) => write!(
                f,
                "a subjectAltName of kind {name} ({}) is refused: Choria never needs one",
                escape(&san.value)
            ),
            kind => write!(
                f,
                "the subjectAltName {}:{} is refused: {} names are allowed only when \
                 cert_allowed_san_kinds lists {}",
                kind.name(),
                escape(&san.value),
                kind.name(),
                SanKinds::setting_name(kind)
            ),
        }
    }
}

/// As `openssl x509 -text` prints it (`IP:10.0.0.1`), escaped.
impl fmt::Display for OtherSan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind.name(), escape(&self.value))
    }
}

/// The SAN kinds besides DNS that a CSR or a helper's certificate may carry
/// (`cert_allowed_san_kinds`); none by default, since a Choria server is named by its DNS name
/// alone and an IP, URI or email SAN is a name other software may trust.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SanKinds {
    ip: bool,
    uri: bool,
    email: bool,
}

impl SanKinds {
    /// The value names of the setting, in order.
    pub const NAMES: [&'static str; 3] = ["ip", "uri", "email"];

    /// Whether a SAN of `kind` may appear.
    pub(crate) fn allows(self, kind: SanKind) -> bool {
        match kind {
            SanKind::Ip => self.ip,
            SanKind::Uri => self.uri,
            SanKind::Email => self.email,
            SanKind::Unusual(_) => false,
        }
    }

    /// Adds the kind named `name` (`ip`, `uri` or `email`, any case); false for anything else.
    pub fn allow(&mut self, name: &str) -> bool {
        match name.to_ascii_lowercase().as_str() {
            "ip" => self.ip = true,
            "uri" => self.uri = true,
            "email" => self.email = true,
            _ => return false,
        }
        true
    }

    /// The value of the setting that allows `kind`.
    fn setting_name(kind: SanKind) -> &'static str {
        match kind {
            SanKind::Ip => "ip",
            SanKind::Uri => "uri",
            SanKind::Email => "email",
            SanKind::Unusual(name) => name,
        }
    }

    /// The kinds allowed, by their setting names.
    pub fn names(self) -> Vec<&'static str> {
        [(self.ip, "ip"), (self.uri, "uri"), (self.email, "email")]
            .into_iter()
            .filter_map(|(on, name)| on.then_some(name))
            .collect()
    }
}

/// The SAN of `name` as the checks read it: a DNS name, or another kind.
pub(crate) enum San {
    Dns(String),
    Other(OtherSan),
}

/// Reads one GeneralName.
pub(crate) fn read_general_name(name: &GeneralName) -> San {
    let other = |kind, value: String| San::Other(OtherSan { kind, value });
    match name {
        GeneralName::DNSName(dns) => San::Dns(dns.to_string()),
        GeneralName::IPAddress(bytes) => other(SanKind::Ip, ip_text(bytes)),
        GeneralName::URI(uri) => other(SanKind::Uri, uri.to_string()),
        GeneralName::RFC822Name(mail) => other(SanKind::Email, mail.to_string()),
        GeneralName::OtherName(oid, _) => other(SanKind::Unusual("otherName"), oid.to_id_string()),
        GeneralName::DirectoryName(dn) => other(SanKind::Unusual("directoryName"), dn.to_string()),
        GeneralName::X400Address(_) => other(SanKind::Unusual("x400Address"), String::new()),
        GeneralName::EDIPartyName(_) => other(SanKind::Unusual("ediPartyName"), String::new()),
        GeneralName::RegisteredID(oid) => {
            other(SanKind::Unusual("registeredID"), oid.to_id_string())
        }
    }
}

/// An IP SAN as text: IPv4 or IPv6, else the bytes in hex (a SAN of another length).
fn ip_text(bytes: &[u8]) -> String {
    match bytes.len() {
        4 => std::net::Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]).to_string(),
        16 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(bytes);
            std::net::Ipv6Addr::from(octets).to_string()
        }
        _ => hex::encode(bytes),
    }
}
