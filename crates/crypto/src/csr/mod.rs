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

mod deny;
mod san;
#[cfg(test)]
mod tests;

use std::fmt;

use choria_wire::text::escape;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::cri_attributes::ParsedCriAttribute;
use x509_parser::der_parser::asn1_rs::Tag;
use x509_parser::extensions::ParsedExtension;
use x509_parser::oid_registry::OID_X509_EXT_SUBJECT_ALT_NAME;
use x509_parser::prelude::FromDer;

pub use deny::{DenyList, DenyListError, DEFAULT_DENY_PATTERNS};
use san::{has_empty_label, RefusedSanText};
pub(crate) use san::{read_general_name, San};
pub use san::{OtherSan, SanKinds};

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

/// What was wrong with a CSR or the deny list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CsrError {
    /// The reply had no CSR text at all.
    Empty,
    /// No `-----BEGIN ...-----` block could be found (Go panics here).
    NoPemBlock {
        /// What the PEM reader found instead.
        reason: String,
    },
    /// The PEM body is not a PKCS#10 request.
    Parse {
        /// The PKCS#10 parser's reason.
        reason: String,
    },
    /// The common name differs from the identity (an empty CN lands here too).
    CommonNameMismatch {
        /// The CSR's common name, as the node wrote it.
        common_name: String,
        /// The node's identity.
        identity: String,
    },
    /// The common name is not a valid identity (see `choria_wire::identity`).
    InvalidCommonName {
        /// The CSR's common name, as the node wrote it.
        common_name: String,
        /// Why it is not an identity.
        reason: String,
    },
    /// The subject holds more than one CN.
    SeveralCommonNames {
        /// How many CN attributes the subject holds.
        count: usize,
    },
    /// A subjectAltName extension that does not parse: the whole request is refused.
    BadSubjectAltName {
        /// The parser's reason.
        reason: String,
    },
    /// A CN or DNS SAN matched a deny-list pattern.
    Denied {
        /// The name that matched, as the node wrote it.
        name: String,
        /// The deny-list entry it matched, as configured.
        pattern: String,
    },
    /// The reply is not exactly one `CERTIFICATE REQUEST` block and nothing else.
    NotOneRequest {
        /// What else the reply holds.
        reason: String,
    },
    /// A DNS SAN that is not a host name (an empty label).
    BadDnsName {
        /// The DNS SAN, as the node wrote it.
        name: String,
    },
    /// A SAN of a kind that is not allowed.
    RefusedSan {
        /// The SAN refused.
        san: OtherSan,
    },
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

/// The names a CSR asks for: its one CN (empty when absent or not a string, as Go's
/// `Subject.CommonName`), the DNS SANs of all its extension requests, and its other SANs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsrNames {
    /// The one CN, as the node wrote it; "" when there is none.
    pub common_name: String,
    pub(crate) dns_names: Vec<String>,
    other_sans: Vec<OtherSan>,
}

/// The label of the one block a `gencsr` reply holds.
const CSR_LABEL: &str = "CERTIFICATE REQUEST";

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
    /// The request for the helper: one LF-ended `CERTIFICATE REQUEST` block.
    pub pem: String,
    names: CsrNames,
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
