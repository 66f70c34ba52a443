//! CSR checks for `features.pki` (provisioner host/host.go, validateCSR): the node's `gencsr` reply
//! must carry a parsable PKCS#10 request whose common name is the node's identity, and neither
//! that name nor any DNS SAN may match the configured deny list.
//!
//! Go compatibility: the CSR's self-signature is not checked (Go does not); an entry written
//! `/re/` loses all its leading and trailing slashes; patterns are unanchored searches. Unlike
//! Go, whose invalid pattern silently never matches, a pattern that does not compile refuses
//! the list (the daemon refuses to start, naming it). The SANs of every `extensionRequest` attribute are read and a
//! SAN extension that does not parse refuses the whole request, as Go's
//! `x509.ParseCertificateRequest` does (x509-parser's `requested_extensions` reads only the
//! first attribute, so the attributes are walked here).
//!
//! Stricter than Go, on purpose: a reply without a PEM block is an error, not a panic; the
//! common name must be a valid identity (`choria_wire::identity`); and a subject with more
//! than one CN is refused. Go compares only the last CN, while `openssl x509 -req` (what a
//! helper typically signs with) copies every CN into the certificate, so a node could get a
//! certificate that other software reads as someone else's.
//!
//! The reply is checked whole: it must be exactly one PEM block labelled `CERTIFICATE REQUEST`,
//! without headers, with nothing but white space around it, whose DER is one request and
//! nothing after it (go-choria's `gencsr` emits exactly that:
//! providers/agent/mcorpc/golang/provision/csr_action.go). Go's `pem.Decode` reads the first
//! block whatever its label, while openssl reads the first block labelled as a request, so a
//! relabelled valid CSR followed by a privileged one passed Go's check and got the second one
//! signed. What the helper is then given is [`ValidatedCsr::pem`]: the validated DER encoded
//! again, never the node's text.
//!
//! Names are matched against the deny list as written and also lowercased without one
//! trailing dot (DNS names are case-insensitive and `broker.example.net.` is the same name),
//! so `DNS:BROKER.EXAMPLE.NET` cannot slip past `^broker\.example\.net$`. A DNS SAN with an
//! empty label is refused. SANs of the kinds Choria never needs are refused unless
//! `cert_allowed_san_kinds` allows them ([`SanKinds`]: IP, URI, email), and the rarer kinds
//! (otherName, directoryName, ...) always are.

use std::fmt;

use choria_wire::text::escape;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::cri_attributes::ParsedCriAttribute;
use x509_parser::der_parser::asn1_rs::Tag;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::OID_X509_EXT_SUBJECT_ALT_NAME;
use x509_parser::prelude::FromDer;

/// A name from a CSR in a message: escaped, and nothing at all when empty (Go's message for a
/// missing CN reads `common name  does not match`).
struct DisplayName<'a>(&'a str);

impl fmt::Display for DisplayName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            Ok(())
        } else {
            write!(f, "{}", escape(self.0))
        }
    }
}

/// The deny list used when `cert_deny_list` is empty (Go `config/config.go`; the second `.`
/// in the first two is unescaped there too).
pub const DEFAULT_DENY_PATTERNS: [&str; 4] = [
    r"\.privileged.mcollective$",
    r"\.privileged.choria$",
    r"\.mcollective$",
    r"\.choria$",
];

/// What was wrong with a CSR or the deny list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CsrError {
    /// The reply had no CSR text at all.
    Empty,
    /// No `-----BEGIN ...-----` block could be found (Go panics here).
    NoPemBlock { reason: String },
    /// The PEM body is not a PKCS#10 request.
    Parse { reason: String },
    /// The common name differs from the identity (an empty CN lands here too).
    CommonNameMismatch {
        common_name: String,
        identity: String,
    },
    /// The common name is not a valid identity (see `choria_wire::identity`).
    InvalidCommonName { common_name: String, reason: String },
    /// The subject holds more than one CN.
    SeveralCommonNames { count: usize },
    /// A subjectAltName extension that does not parse: the whole request is refused.
    BadSubjectAltName { reason: String },
    /// A CN or DNS SAN matched a deny-list pattern.
    Denied { name: String, pattern: String },
    /// The reply is not exactly one `CERTIFICATE REQUEST` block and nothing else.
    NotOneRequest { reason: String },
    /// A DNS SAN that is not a host name (an empty label).
    BadDnsName { name: String },
    /// A SAN of a kind that is not allowed.
    RefusedSan { san: OtherSan },
}

impl fmt::Display for CsrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CsrError::Empty => write!(f, "no CSR received"),
            CsrError::NoPemBlock { reason } => {
                write!(f, "could not parse CSR: no PEM block found: {reason}")
            }
            CsrError::Parse { reason } => write!(f, "could not parse CSR: {reason}"),
            CsrError::CommonNameMismatch {
                common_name,
                identity,
            } => write!(
                f,
                "common name {} does not match identity {identity}",
                DisplayName(common_name)
            ),
            CsrError::InvalidCommonName {
                common_name,
                reason,
            } => write!(
                f,
                "common name {} is not a valid identity: {reason}",
                escape(common_name)
            ),
            CsrError::SeveralCommonNames { count } => write!(
                f,
                "the subject holds {count} common names; exactly one is allowed, since Go's \
                 check reads only the last while openssl copies them all into the certificate"
            ),
            CsrError::BadSubjectAltName { reason } => write!(
                f,
                "a subjectAltName extension does not parse, so the request is refused: {reason}"
            ),
            CsrError::Denied { name, pattern } => {
                write!(
                    f,
                    "{} matches denied certificate pattern {pattern:?}",
                    DisplayName(name)
                )
            }
            CsrError::NotOneRequest { reason } => write!(
                f,
                "the CSR must be exactly one CERTIFICATE REQUEST PEM block and nothing else: \
                 {reason}"
            ),
            CsrError::BadDnsName { name } => write!(
                f,
                "the DNS name {} is not a host name (it has an empty label)",
                escape(name)
            ),
            CsrError::RefusedSan { san } => write!(f, "{}", RefusedSanText(san)),
        }
    }
}

impl std::error::Error for CsrError {}

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
    pub fn matching_pattern(&self, name: &str) -> Option<&str> {
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
pub fn normalised_name(name: &str) -> String {
    let name = name.strip_suffix('.').unwrap_or(name);
    name.to_lowercase()
}

/// Whether a DNS name has an empty label once one trailing dot is removed (`a..b`, `.a`,
/// `a..`, empty): no host is named so, and a name matched against the deny list must be one.
pub fn has_empty_label(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    name.split('.').any(str::is_empty)
}

/// A kind of subject alternative name other than DNS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SanKind {
    Ip,
    Uri,
    Email,
    /// otherName, directoryName, x400Address, ediPartyName or registeredID (named): nothing in
    /// Choria uses them, so no setting allows them.
    Unusual(&'static str),
}

impl SanKind {
    /// As `openssl x509 -text` names it.
    pub fn name(self) -> &'static str {
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
    pub kind: SanKind,
    /// The value as text (an IP address, a URI, an address; a description for the rest).
    pub value: String,
}

/// The refusal of a SAN, shared by CSR and certificate errors.
pub(crate) struct RefusedSanText<'a>(&'a OtherSan);

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
    pub ip: bool,
    pub uri: bool,
    pub email: bool,
}

impl SanKinds {
    /// The value names of the setting, in order.
    pub const NAMES: [&'static str; 3] = ["ip", "uri", "email"];

    /// Whether a SAN of `kind` may appear.
    pub fn allows(self, kind: SanKind) -> bool {
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
pub(crate) fn ip_text(bytes: &[u8]) -> String {
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

/// Go: an entry matching `^/.+/$` has all leading and all trailing `/` trimmed (`TrimLeft` and
/// `TrimRight` with cutset `/`).
fn strip_slashes(entry: &str) -> &str {
    if entry.len() >= 3 && entry.starts_with('/') && entry.ends_with('/') {
        entry.trim_start_matches('/').trim_end_matches('/')
    } else {
        entry
    }
}

/// The names a CSR asks for: its one CN (empty when absent or not a string, as Go's
/// `Subject.CommonName`), the DNS SANs of all its extension requests, and its other SANs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsrNames {
    pub common_name: String,
    pub dns_names: Vec<String>,
    pub other_sans: Vec<OtherSan>,
}

/// The label of the one block a `gencsr` reply holds.
pub const CSR_LABEL: &str = "CERTIFICATE REQUEST";

/// The DER of the one `CERTIFICATE REQUEST` block that `csr_pem` must be (see the module doc).
fn single_request_der(csr_pem: &str) -> Result<Vec<u8>, CsrError> {
    let not_one = |reason: String| CsrError::NotOneRequest { reason };
    if csr_pem.is_empty() {
        return Err(CsrError::Empty);
    }
    let blocks = pem::parse_many(csr_pem).map_err(|e| CsrError::NoPemBlock {
        reason: e.to_string(),
    })?;
    // Counted in the text too: a block the PEM parser skips is still a block openssl may read.
    let begins = csr_pem.matches("-----BEGIN").count();
    let block = match blocks.as_slice() {
        [] => {
            return Err(CsrError::NoPemBlock {
                reason: "none found".to_string(),
            })
        }
        [block] if begins == 1 => block,
        _ => {
            let labels: Vec<String> = blocks.iter().map(|b| format!("{:?}", b.tag())).collect();
            return Err(not_one(format!(
                "it holds {} blocks ({} readable: {})",
                begins.max(blocks.len()),
                blocks.len(),
                labels.join(", ")
            )));
        }
    };
    if block.tag() != CSR_LABEL {
        return Err(not_one(format!(
            "its block is labelled {}",
            escape(block.tag())
        )));
    }
    if block.headers().iter().next().is_some() {
        return Err(not_one("its block has PEM headers".to_string()));
    }
    let trimmed = csr_pem.trim_matches(|c: char| c.is_ascii_whitespace());
    if !trimmed.starts_with(&format!("-----BEGIN {CSR_LABEL}-----"))
        || !trimmed.ends_with(&format!("-----END {CSR_LABEL}-----"))
        || csr_pem.matches("-----END").count() != 1
    {
        return Err(not_one("text surrounds the block".to_string()));
    }
    let der = block.contents();
    let (rest, _) = X509CertificationRequest::from_der(der).map_err(|e| CsrError::Parse {
        reason: e.to_string(),
    })?;
    if !rest.is_empty() {
        return Err(not_one(format!(
            "{} bytes follow the request in its block",
            rest.len()
        )));
    }
    Ok(der.to_vec())
}

/// Reads the one `CERTIFICATE REQUEST` block `csr_pem` must be and returns its names.
pub fn csr_names(csr_pem: &str) -> Result<CsrNames, CsrError> {
    names_of(&single_request_der(csr_pem)?)
}

/// The names of a request's DER.
fn names_of(der: &[u8]) -> Result<CsrNames, CsrError> {
    let (_, request) = X509CertificationRequest::from_der(der).map_err(|e| CsrError::Parse {
        reason: e.to_string(),
    })?;

    let info = &request.certification_request_info;
    let common_names: Vec<_> = info.subject.iter_common_name().collect();
    if common_names.len() > 1 {
        return Err(CsrError::SeveralCommonNames {
            count: common_names.len(),
        });
    }
    let common_name = common_names
        .first()
        .and_then(|attribute| attribute_string(attribute.attr_value()))
        .unwrap_or_default();

    // Every extensionRequest attribute, as Go's parseCSRExtensions appends them all.
    let mut dns_names = Vec::new();
    let mut other_sans = Vec::new();
    for attribute in info.iter_attributes() {
        let ParsedCriAttribute::ExtensionRequest(requested) = attribute.parsed_attribute() else {
            continue;
        };
        for extension in &requested.extensions {
            if extension.oid != OID_X509_EXT_SUBJECT_ALT_NAME {
                continue;
            }
            match extension.parsed_extension() {
                ParsedExtension::SubjectAlternativeName(san) => {
                    for general_name in &san.general_names {
                        match read_general_name(general_name) {
                            San::Dns(dns) => dns_names.push(dns),
                            San::Other(other) => other_sans.push(other),
                        }
                    }
                }
                ParsedExtension::ParseError { error } => {
                    return Err(CsrError::BadSubjectAltName {
                        reason: error.to_string(),
                    })
                }
                other => {
                    return Err(CsrError::BadSubjectAltName {
                        reason: format!("read as {other:?}"),
                    })
                }
            }
        }
    }
    Ok(CsrNames {
        common_name,
        dns_names,
        other_sans,
    })
}

/// The string value of an attribute as Go's asn1 decodes it, or None for non-string types.
fn attribute_string(value: &x509_parser::der_parser::asn1_rs::Any) -> Option<String> {
    let data = value.data;
    match value.tag() {
        Tag::PrintableString | Tag::Utf8String | Tag::Ia5String | Tag::NumericString => {
            std::str::from_utf8(data).ok().map(str::to_string)
        }
        // Go keeps T61 bytes as they are (Latin-1 in practice).
        Tag::T61String => Some(data.iter().map(|&b| b as char).collect()),
        Tag::BmpString => {
            if !data.len().is_multiple_of(2) {
                return None;
            }
            let units: Vec<u16> = data
                .chunks_exact(2)
                .map(|pair| u16::from_be_bytes([pair[0], pair[1]]))
                .collect();
            String::from_utf16(&units).ok()
        }
        _ => None,
    }
}

/// A CSR that passed [`validate_csr`]: its names, and the PEM to hand on (the validated DER
/// encoded again, so nothing the node wrote around it reaches the helper).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedCsr {
    pub pem: String,
    pub names: CsrNames,
}

/// Go `validateCSR`: the CN must equal `identity`; the CN and every DNS SAN must not match the
/// deny list. Also refused: anything but one `CERTIFICATE REQUEST` block, a CN that is not a
/// valid identity, several CNs, a SAN that does not parse, a DNS SAN with an empty label, and
/// SANs of kinds `san_kinds` does not allow.
pub fn validate_csr(
    csr_pem: &str,
    identity: &str,
    deny: &DenyList,
    san_kinds: SanKinds,
) -> Result<ValidatedCsr, CsrError> {
    let der = single_request_der(csr_pem)?;
    let names = names_of(&der)?;
    // An empty CN is the mismatch Go reports; anything else must be a valid identity first.
    if !names.common_name.is_empty() {
        if let Err(err) = choria_wire::identity::check(&names.common_name) {
            return Err(CsrError::InvalidCommonName {
                common_name: names.common_name,
                reason: err.to_string(),
            });
        }
    }
    if names.common_name != identity {
        return Err(CsrError::CommonNameMismatch {
            common_name: names.common_name,
            identity: identity.to_string(),
        });
    }
    check_sans(&names.dns_names, &names.other_sans, san_kinds)?;
    for name in std::iter::once(&names.common_name).chain(names.dns_names.iter()) {
        if let Some(pattern) = deny.matching_pattern(name) {
            return Err(CsrError::Denied {
                name: name.clone(),
                pattern: pattern.to_string(),
            });
        }
    }
    let pem = pem::encode_config(
        &pem::Pem::new(CSR_LABEL, der),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    );
    Ok(ValidatedCsr { pem, names })
}

/// DNS SANs must be host names; other SANs must be of a kind allowed.
pub(crate) fn check_sans(
    dns_names: &[String],
    other_sans: &[OtherSan],
    san_kinds: SanKinds,
) -> Result<(), CsrError> {
    if let Some(name) = dns_names.iter().find(|name| has_empty_label(name)) {
        return Err(CsrError::BadDnsName { name: name.clone() });
    }
    if let Some(san) = other_sans.iter().find(|san| !san_kinds.allows(san.kind)) {
        return Err(CsrError::RefusedSan { san: san.clone() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use choria_testkit::vector_path;
    use rsa::pkcs1::DecodeRsaPrivateKey;
    use std::str::FromStr;
    use x509_cert::builder::{Builder, RequestBuilder};
    use x509_cert::ext::pkix::name::GeneralName as CertGeneralName;
    use x509_cert::ext::pkix::SubjectAltName;
    use x509_cert::name::Name;

    fn read_vector(relative: &str) -> String {
        std::fs::read_to_string(vector_path(relative))
            .unwrap_or_else(|e| panic!("reading vector {relative}: {e}"))
    }

    /// A CSR signed with a test RSA key, with `subject` in RFC 4514 order (the leftmost RDN is
    /// the last one in the DER, so `CN=b,CN=a` has last CN `b`) and the given DNS SANs.
    fn make_csr(subject: &str, dns: &[&str]) -> String {
        let sans: Vec<String> = dns.iter().map(|d| format!("DNS:{d}")).collect();
        let sans: Vec<&str> = sans.iter().map(String::as_str).collect();
        make_csr_with_sans(subject, &sans)
    }

    /// As `make_csr`, with SANs written as openssl does: `DNS:x`, `IP:192.0.2.1`, `URI:x`,
    /// `email:x`.
    fn make_csr_with_sans(subject: &str, sans: &[&str]) -> String {
        use x509_cert::der::asn1::{Ia5String, OctetString};
        let dns: Vec<CertGeneralName> = sans
            .iter()
            .map(|san| {
                let (kind, value) = san.split_once(':').expect("KIND:value");
                let ia5 = || Ia5String::new(value).expect("ia5 name");
                match kind {
                    "DNS" => CertGeneralName::DnsName(ia5()),
                    "URI" => CertGeneralName::UniformResourceIdentifier(ia5()),
                    "email" => CertGeneralName::Rfc822Name(ia5()),
                    "IP" => {
                        let ip: std::net::Ipv4Addr = value.parse().expect("IPv4");
                        CertGeneralName::IpAddress(
                            OctetString::new(ip.octets().to_vec()).expect("octets"),
                        )
                    }
                    other => panic!("no SAN kind {other} here"),
                }
            })
            .collect();
        let key_pem = read_vector("tokens/testdata/rsa/signer-key.pem");
        let key = rsa::RsaPrivateKey::from_pkcs1_pem(&key_pem).expect("test key");
        let signer = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(key);
        let name = Name::from_str(subject).expect("subject");
        let mut builder = RequestBuilder::new(name, &signer).expect("builder");
        if !dns.is_empty() {
            builder
                .add_extension(&SubjectAltName(dns))
                .expect("san extension");
        }
        let request = builder
            .build::<rsa::pkcs1v15::Signature>()
            .expect("build csr");
        use x509_cert::der::EncodePem;
        request
            .to_pem(x509_cert::der::pem::LineEnding::LF)
            .expect("csr to pem")
    }

    /// `validate_csr` with no SAN kind beyond DNS allowed, its outcome alone.
    fn check(csr_pem: &str, identity: &str, deny: &DenyList) -> Result<(), CsrError> {
        validate_csr(csr_pem, identity, deny, SanKinds::default()).map(|_| ())
    }

    fn default_deny() -> DenyList {
        DenyList::new(&[]).expect("default deny list")
    }

    #[test]
    fn vector_csrs_come_out_as_the_spec_says() {
        // (file, identity, expected: Ok(()) or the error's Display prefix)
        let cases: &[(&str, &str, Result<(), &str>)] = &[
            ("go-choria/broker/network/testdata/ssl/certificate_requests/rip.mcollective.pem", "rip.mcollective", Err("rip.mcollective matches denied certificate pattern \"\\\\.mcollective$\"")),
            ("go-choria/providers/security/testdata/good/certificate_requests/rip.mcollective.pem", "rip.mcollective", Err("rip.mcollective matches denied certificate pattern")),
            ("go-choria/broker/network/testdata/ssl/certificate_requests/rip.mcollective.pem", "other.example.net", Err("common name rip.mcollective does not match identity other.example.net")),
            ("go-choria/integration/ca/one/rip.mcollective.csr", "rip.mcollective", Err("common name  does not match identity rip.mcollective")),
            ("go-choria/integration/ca/one/localhost.csr", "localhost", Err("common name  does not match identity localhost")),
            ("go-choria/integration/ca/two/rip.mcollective.csr", "rip.mcollective", Err("common name  does not match identity rip.mcollective")),
            ("go-choria/integration/ca/two/localhost.csr", "localhost", Err("common name  does not match identity localhost")),
            ("go-choria/providers/security/testdata/intermediate/rip.mcollective.csr", "rip.mcollective", Err("common name  does not match identity")),
            ("go-choria/providers/security/testdata/intermediate/email.rip.mcollective.csr", "rip.mcollective", Err("common name  does not match identity")),
        ];
        let deny = default_deny();
        for (file, identity, expected) in cases {
            let got = check(&read_vector(file), identity, &deny);
            match (expected, &got) {
                (Ok(()), Ok(())) => {}
                (Err(prefix), Err(e)) => assert!(
                    e.to_string().starts_with(prefix),
                    "{file}: got error {e:?} ({e}), want prefix {prefix:?}"
                ),
                _ => panic!("{file} as {identity}: got {got:?}, want {expected:?}"),
            }
        }
    }

    #[test]
    fn vector_csr_names_are_read() {
        // (file, last CN, DNS SANs)
        let cases: &[(&str, &str, &[&str])] = &[
            (
                "go-choria/broker/network/testdata/ssl/certificate_requests/rip.mcollective.pem",
                "rip.mcollective",
                &[],
            ),
            (
                "go-choria/integration/ca/one/rip.mcollective.csr",
                "",
                &["rip.mcollective"],
            ),
            (
                "go-choria/integration/ca/one/localhost.csr",
                "",
                &["localhost"],
            ),
        ];
        for (file, cn, dns) in cases {
            let names = csr_names(&read_vector(file)).expect(file);
            assert_eq!(names.common_name, *cn, "{file}");
            assert_eq!(names.dns_names, *dns, "{file}");
        }
    }

    #[test]
    fn vector_csr_passes_with_a_deny_list_that_does_not_match() {
        let deny = DenyList::new(&["/^evil\\./".to_string()]).expect("deny");
        let csr = read_vector(
            "go-choria/broker/network/testdata/ssl/certificate_requests/rip.mcollective.pem",
        );
        assert_eq!(check(&csr, "rip.mcollective", &deny), Ok(()));
    }

    #[test]
    fn generated_csrs_against_the_default_deny_list() {
        // (subject in RFC 4514 order, DNS SANs, identity, expected error Display prefix or None)
        let cases: &[(&str, &[&str], &str, Option<&str>)] = &[
            ("CN=node1.example.net", &[], "node1.example.net", None),
            ("CN=node1.example.net,OU=ops,O=Acme", &["node1.example.net", "alias.example.net"], "node1.example.net", None),
            ("CN=node1.example.net", &["evil.choria"], "node1.example.net", Some("evil.choria matches denied certificate pattern")),
            ("CN=node1.mcollective", &[], "node1.mcollective", Some("node1.mcollective matches denied certificate pattern")),
            ("CN=x.privileged.choria", &[], "x.privileged.choria", Some("x.privileged.choria matches denied certificate pattern \"\\\\.privileged.choria$\"")),
            // the unescaped `.` in `\.privileged.choria$` matches any character
            ("CN=x.privilegedXchoria", &[], "x.privilegedXchoria", Some("x.privilegedXchoria matches denied certificate pattern \"\\\\.privileged.choria$\"")),
            ("CN=choria.example.net", &[], "choria.example.net", None),
            // Go reads only the last CN; openssl copies both into the certificate: refused
            ("CN=node1.example.net,CN=first.example.net", &[], "node1.example.net", Some("the subject holds 2 common names")),
            ("CN=first.example.net,CN=node1.example.net", &[], "node1.example.net", Some("the subject holds 2 common names")),
            ("CN=node1.example.net+CN=other.example.net", &[], "node1.example.net", Some("the subject holds 2 common names")),
            // a CN that is not an identity is refused as such, escaped
            ("CN=a\\0Db", &[], "node1.example.net", Some("common name \"a\\rb\" is not a valid identity")),
            ("CN=n1\\,DNS:broker.example.net", &[], "n1", Some("common name n1,DNS:broker.example.net does not match identity n1")),
            ("OU=ops", &["node1.example.net"], "node1.example.net", Some("common name  does not match identity node1.example.net")),
            ("CN=Node1.example.net", &[], "node1.example.net", Some("common name Node1.example.net does not match identity")),
        ];
        let deny = default_deny();
        for (subject, dns, identity, expected) in cases {
            let csr = make_csr(subject, dns);
            let got = check(&csr, identity, &deny);
            match (expected, &got) {
                (None, Ok(())) => {}
                (Some(prefix), Err(e)) => assert!(
                    e.to_string().starts_with(prefix),
                    "{subject} {dns:?}: got {e}, want prefix {prefix:?}"
                ),
                _ => panic!("{subject} {dns:?} as {identity}: got {got:?}, want {expected:?}"),
            }
        }
    }

    #[test]
    fn deny_list_rules_as_go() {
        // (configured entries, name, expected matching entry)
        let cases: &[(&[&str], &str, Option<&str>)] = &[
            (&[], "a.choria", Some(r"\.choria$")),
            (&[], "a.choria.example", None),
            (&[], "a.mcollective", Some(r"\.mcollective$")),
            // `/re/` form: all leading and trailing slashes go
            (&["/bad/"], "is-bad-host", Some("/bad/")),
            (&["//bad//"], "is-bad-host", Some("//bad//")),
            // unanchored search
            (&["bad"], "xbadx", Some("bad")),
            (&["^bad$"], "xbadx", None),
            // `//` is not the /re/ form (needs one char inside): the regex is `//` itself
            (&["//"], "a//b", Some("//")),
            (&["//"], "ab", None),
            // a configured list replaces the defaults
            (&["^nothing$"], "a.choria", None),
        ];
        for (entries, name, expected) in cases {
            let entries: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
            let deny = DenyList::new(&entries).expect("deny list");
            assert_eq!(
                deny.matching_pattern(name),
                *expected,
                "{entries:?} vs {name}"
            );
        }
        // An invalid regex never matches because it never gets in: the list is refused,
        // naming the entry (Go keeps it and silently never matches it).
        for (entries, refused) in [
            (&["/(unclosed/"][..], "/(unclosed/"),
            (&["(unclosed", "host"][..], "(unclosed"),
        ] {
            let entries: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
            let err = DenyList::new(&entries).expect_err("an invalid pattern");
            assert_eq!(err.entry, refused);
            assert!(
                err.to_string().contains("not a valid regular expression"),
                "{err}"
            );
        }
        let defaults = DenyList::new(&[]).expect("defaults");
        assert!(defaults.entries().eq(DEFAULT_DENY_PATTERNS));
    }

    #[test]
    fn malformed_csr_text_is_an_error_not_a_panic() {
        // (input, expected error Display prefix)
        let cases: &[(&str, &str)] = &[
            ("", "no CSR received"),
            (
                "not a pem at all",
                "could not parse CSR: no PEM block found",
            ),
            (
                "-----BEGIN CERTIFICATE REQUEST-----\n",
                "could not parse CSR: no PEM block found",
            ),
            (
                "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
                "could not parse CSR:",
            ),
            (
                "-----BEGIN CERTIFICATE REQUEST-----\n!!!!\n-----END CERTIFICATE REQUEST-----\n",
                "could not parse CSR:",
            ),
        ];
        let deny = default_deny();
        for (input, prefix) in cases {
            let err = check(input, "node", &deny).expect_err(input);
            assert!(err.to_string().starts_with(prefix), "{input:?}: got {err}");
        }
    }

    /// `text` with the label of its first PEM block replaced by `label`.
    fn relabelled(text: &str, label: &str) -> String {
        text.replace("BEGIN CERTIFICATE REQUEST", &format!("BEGIN {label}"))
            .replace("END CERTIFICATE REQUEST", &format!("END {label}"))
    }

    #[test]
    fn the_reply_must_be_one_certificate_request_block_and_nothing_else() {
        const ID: &str = "node1.example.net";
        let good = make_csr(&format!("CN={ID}"), &[]);
        // The attack of the issue: a relabelled valid CSR first (what Go's pem.Decode reads),
        // then a privileged one (what openssl reads first as a request).
        let privileged = make_csr(
            &format!("CN={ID},CN=evil.privileged.mcollective"),
            &["broker.example.net"],
        );
        let two_blocks = format!("{}{privileged}", relabelled(&good, "NOTE"));
        let body_start = good.find('\n').expect("a BEGIN line") + 1;
        let with_headers = format!(
            "{}Proc-Type: 4,ENCRYPTED\n\n{}",
            &good[..body_start],
            &good[body_start..]
        );
        let der = pem::parse(&good).expect("pem").contents().to_vec();
        let trailing = pem::encode(&pem::Pem::new(
            CSR_LABEL,
            [der.clone(), vec![0x05, 0x00]].concat(),
        ));
        // (case, text, expected error Display substring)
        let cases: Vec<(&str, String, &str)> = vec![
            (
                "two blocks, the first relabelled",
                two_blocks,
                "it holds 2 blocks (2 readable: \"NOTE\", \"CERTIFICATE REQUEST\")",
            ),
            (
                "the same block twice",
                format!("{good}{good}"),
                "it holds 2 blocks",
            ),
            (
                "a block and an unfinished one",
                format!("{good}-----BEGIN CERTIFICATE REQUEST-----\n"),
                "it holds 2 blocks (1 readable",
            ),
            (
                "the old label openssl also reads",
                relabelled(&good, "NEW CERTIFICATE REQUEST"),
                "its block is labelled NEW CERTIFICATE REQUEST",
            ),
            (
                "a certificate label",
                relabelled(&good, "CERTIFICATE"),
                "its block is labelled CERTIFICATE",
            ),
            ("PEM headers", with_headers, "its block has PEM headers"),
            (
                "text before",
                format!("garbage before\n{good}"),
                "text surrounds the block",
            ),
            (
                "text after",
                format!("{good}trailing words\n"),
                "text surrounds the block",
            ),
            (
                "text after, ending as a PEM line does",
                format!("{good}words-----"),
                "text surrounds the block",
            ),
            (
                "a stray END line after",
                format!("{good}-----END CERTIFICATE REQUEST-----\n"),
                "text surrounds the block",
            ),
            (
                "bytes after the request",
                trailing,
                "2 bytes follow the request in its block",
            ),
        ];
        let deny = default_deny();
        for (case, text, want) in cases {
            let err = check(&text, ID, &deny).expect_err(case);
            assert!(err.to_string().contains(want), "{case}: {err}");
            assert!(
                err.to_string().starts_with(
                    "the CSR must be exactly one CERTIFICATE REQUEST PEM block and nothing else"
                ),
                "{case}: {err}"
            );
            assert!(csr_names(&text).is_err(), "{case}");
        }
        // White space around the one block is no text: it passes.
        for text in [format!("\n\n{good}\n"), good.replace('\n', "\r\n")] {
            check(&text, ID, &deny).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        }
    }

    #[test]
    fn the_helper_is_given_the_validated_request_encoded_again() {
        const ID: &str = "node1.example.net";
        let good = make_csr(&format!("CN={ID}"), &[]);
        let der = pem::parse(&good).expect("pem").contents().to_vec();
        // CRLF line ends, surrounding blank lines, a short last line: the same request.
        let untidy = format!("\r\n{}\r\n\r\n", good.replace('\n', "\r\n"));
        let validated =
            validate_csr(&untidy, ID, &default_deny(), SanKinds::default()).expect("valid");
        assert_eq!(
            validated.pem, good,
            "one LF-ended block, as the node's encoder writes it"
        );
        assert_eq!(
            pem::parse(&validated.pem).expect("pem").contents(),
            der.as_slice()
        );
        assert_eq!(validated.names.common_name, ID);
    }

    #[test]
    fn the_deny_list_reads_names_lowercased_and_without_one_trailing_dot() {
        let deny = DenyList::new(&[r"^broker\.example\.net$".to_string()]).expect("deny");
        // (DNS SANs, expected error substring or None)
        let cases: &[(&[&str], Option<&str>)] = &[
            (&["node1.example.net"], None),
            (
                &["broker.example.net"],
                Some("broker.example.net matches denied"),
            ),
            (
                &["BROKER.EXAMPLE.NET"],
                Some("BROKER.EXAMPLE.NET matches denied"),
            ),
            (
                &["broker.example.net."],
                Some("broker.example.net. matches denied"),
            ),
            (
                &["Broker.Example.Net."],
                Some("Broker.Example.Net. matches denied"),
            ),
            // Two trailing dots are no host name at all.
            (
                &["broker.example.net.."],
                Some("is not a host name (it has an empty label)"),
            ),
            (&["broker..example.net"], Some("is not a host name")),
            (&[".broker.example.net"], Some("is not a host name")),
            (
                &["node1.example.net", "broker.example.net."],
                Some("matches denied"),
            ),
        ];
        for (dns, want) in cases {
            let csr = make_csr("CN=node1.example.net", dns);
            match (check(&csr, "node1.example.net", &deny), want) {
                (Ok(()), None) => {}
                (Err(err), Some(want)) => assert!(err.to_string().contains(want), "{dns:?}: {err}"),
                (got, want) => panic!("{dns:?}: got {got:?}, want {want:?}"),
            }
        }
        // The default list against a CN in capitals (an identity may hold them).
        let csr = make_csr("CN=Node1.CHORIA", &[]);
        let err = check(&csr, "Node1.CHORIA", &default_deny()).expect_err("denied");
        assert!(
            err.to_string()
                .contains(r#"matches denied certificate pattern "\\.choria$""#),
            "{err}"
        );
        // A pattern written in capitals still matches the name as written.
        let upper = DenyList::new(&["^BAD$".to_string()]).expect("deny");
        assert_eq!(upper.matching_pattern("BAD"), Some("^BAD$"));
        assert_eq!(upper.matching_pattern("bad"), None);
        assert_eq!(normalised_name("A.B."), "a.b");
        assert_eq!(normalised_name("a.b.."), "a.b.");
    }

    #[test]
    fn san_kinds_choria_never_needs_are_refused_unless_allowed() {
        const ID: &str = "node1.example.net";
        let deny = default_deny();
        let all = {
            let mut kinds = SanKinds::default();
            for name in SanKinds::NAMES {
                assert!(kinds.allow(name));
            }
            kinds
        };
        assert!(
            !SanKinds::default().allow("dns"),
            "DNS is not a setting: always allowed"
        );
        // (SAN, the kind that allows it, expected refusal)
        let cases = [
            ("IP:192.0.2.7", "ip", "the subjectAltName IP:192.0.2.7 is refused: IP names are allowed only when cert_allowed_san_kinds lists ip"),
            ("URI:spiffe://example.net/x", "uri", "the subjectAltName URI:spiffe://example.net/x is refused"),
            ("email:root@example.net", "email", "cert_allowed_san_kinds lists email"),
        ];
        for (san, kind, want) in cases {
            let csr = make_csr_with_sans(&format!("CN={ID}"), &["DNS:node1.example.net", san]);
            let err = validate_csr(&csr, ID, &deny, SanKinds::default()).expect_err(san);
            assert!(err.to_string().contains(want), "{san}: {err}");
            let mut allowed = SanKinds::default();
            assert!(allowed.allow(&kind.to_uppercase()), "any case");
            assert_eq!(allowed.names(), [kind]);
            let validated =
                validate_csr(&csr, ID, &deny, allowed).unwrap_or_else(|e| panic!("{san}: {e}"));
            assert_eq!(validated.names.other_sans.len(), 1);
            assert_eq!(validated.names.other_sans[0].to_string(), san);
            assert!(validate_csr(&csr, ID, &deny, all).is_ok());
        }
    }

    /// A CSR for `CN=<cn>` signed with the test RSA key whose attributes are exactly
    /// `extension_requests`, one `extensionRequest` attribute per entry, so requests that the
    /// builder cannot make (several attributes, a broken SAN) can be tested.
    fn csr_with_extension_requests(cn: &str, extension_requests: Vec<Vec<Extension>>) -> String {
        use rsa::signature::{Keypair, SignatureEncoding, Signer};
        use x509_cert::attr::Attribute;
        use x509_cert::der::{Encode, EncodePem};
        use x509_cert::request::{CertReq, CertReqInfo, ExtensionReq};
        use x509_cert::spki::{DynSignatureAlgorithmIdentifier, SubjectPublicKeyInfoOwned};

        let key_pem = read_vector("tokens/testdata/rsa/signer-key.pem");
        let key = rsa::RsaPrivateKey::from_pkcs1_pem(&key_pem).expect("test key");
        let signer = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(key);
        let mut attributes = x509_cert::attr::Attributes::new();
        for extensions in extension_requests {
            let attribute = Attribute::try_from(ExtensionReq(extensions)).expect("attribute");
            attributes.insert(attribute).expect("distinct attributes");
        }
        let info = CertReqInfo {
            version: Default::default(),
            subject: Name::from_str(&format!("CN={cn}")).expect("subject"),
            public_key: SubjectPublicKeyInfoOwned::from_key(signer.verifying_key())
                .expect("public key"),
            attributes,
        };
        let signature = signer.sign(&info.to_der().expect("info der"));
        let request = CertReq {
            info,
            algorithm: signer.signature_algorithm_identifier().expect("algorithm"),
            signature: x509_cert::der::asn1::BitString::from_bytes(&signature.to_bytes())
                .expect("bit string"),
        };
        request
            .to_pem(x509_cert::der::pem::LineEnding::LF)
            .expect("csr to pem")
    }

    fn san(names: &[&str]) -> Extension {
        use x509_cert::der::Encode;
        let names = names
            .iter()
            .map(|d| {
                CertGeneralName::DnsName(x509_cert::der::asn1::Ia5String::new(*d).expect("ia5"))
            })
            .collect();
        Extension {
            extn_id: SAN_OID,
            critical: false,
            extn_value: x509_cert::der::asn1::OctetString::new(
                SubjectAltName(names).to_der().expect("san der"),
            )
            .expect("octets"),
        }
    }

    /// A SAN extension whose value is not a GeneralNames sequence (cut short).
    fn broken_san() -> Extension {
        Extension {
            extn_id: SAN_OID,
            critical: false,
            extn_value: x509_cert::der::asn1::OctetString::new(vec![0x30, 0x09, 0x82, 0x07, b'n'])
                .expect("octets"),
        }
    }

    const SAN_OID: x509_cert::der::oid::ObjectIdentifier =
        x509_cert::der::oid::ObjectIdentifier::new_unwrap("2.5.29.17");

    use x509_cert::ext::Extension;

    #[test]
    fn every_extension_request_is_read_and_a_broken_san_refuses_the_request() {
        let deny = default_deny();
        const ID: &str = "node1.example.net";
        let id = ID;
        // (extension requests, expected DNS SANs or the error's Display prefix)
        #[allow(clippy::type_complexity)]
        let cases: Vec<(&str, Vec<Vec<Extension>>, Result<&[&str], &str>)> = vec![
            ("one attribute", vec![vec![san(&[id])]], Ok(&[ID])),
            (
                "two attributes, both read",
                vec![vec![san(&[id])], vec![san(&["alias.example.net"])]],
                Ok(&[ID, "alias.example.net"]),
            ),
            (
                "a denied name in the second attribute",
                vec![vec![san(&[id])], vec![san(&["evil.choria"])]],
                Err("evil.choria matches denied certificate pattern"),
            ),
            (
                "a broken SAN",
                vec![vec![broken_san()]],
                Err("a subjectAltName extension does not parse"),
            ),
            (
                "a broken SAN in the second attribute",
                vec![vec![san(&[id])], vec![broken_san()]],
                Err("a subjectAltName extension does not parse"),
            ),
        ];
        for (name, requests, expected) in cases {
            let csr = csr_with_extension_requests(id, requests);
            match expected {
                Ok(dns) => {
                    let names = csr_names(&csr).unwrap_or_else(|e| panic!("{name}: {e}"));
                    let mut got = names.dns_names.clone();
                    got.sort();
                    let mut want: Vec<String> = dns.iter().map(|d| d.to_string()).collect();
                    want.sort();
                    assert_eq!(got, want, "{name}");
                    assert_eq!(check(&csr, id, &deny), Ok(()), "{name}");
                }
                Err(prefix) => {
                    let err = check(&csr, id, &deny).expect_err(name);
                    assert!(err.to_string().starts_with(prefix), "{name}: {err}");
                }
            }
        }
        // x509-parser's own reading stops at the first attribute: the reason for the walk.
        let csr =
            csr_with_extension_requests(id, vec![vec![san(&[id])], vec![san(&["evil.choria"])]]);
        let block = pem::parse(&csr).expect("pem");
        let (_, request) = X509CertificationRequest::from_der(block.contents()).expect("csr");
        let first_only = request
            .requested_extensions()
            .map(|extensions| extensions.count())
            .unwrap_or(0);
        assert_eq!(first_only, 1);
    }
}
