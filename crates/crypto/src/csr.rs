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

    /// The configured entry that `name` matches, if any.
    pub fn matching_pattern(&self, name: &str) -> Option<&str> {
        self.patterns
            .iter()
            .find(|p| p.regex.is_match(name))
            .map(|p| p.configured.as_str())
    }

    /// The entries in force, as configured (the defaults when none were).
    pub fn entries(&self) -> impl Iterator<Item = &str> {
        self.patterns.iter().map(|p| p.configured.as_str())
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
/// `Subject.CommonName`) and the DNS SANs of all its extension requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsrNames {
    pub common_name: String,
    pub dns_names: Vec<String>,
}

/// Parses the first PEM block of `csr_pem` as a PKCS#10 request and returns its names.
pub fn csr_names(csr_pem: &str) -> Result<CsrNames, CsrError> {
    if csr_pem.is_empty() {
        return Err(CsrError::Empty);
    }
    // Go's pem.Decode ignores the block type; so do we.
    let block = pem::parse(csr_pem).map_err(|e| CsrError::NoPemBlock {
        reason: e.to_string(),
    })?;
    let (_, request) =
        X509CertificationRequest::from_der(block.contents()).map_err(|e| CsrError::Parse {
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
                        if let GeneralName::DNSName(dns) = general_name {
                            dns_names.push(dns.to_string());
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

/// Go `validateCSR`: the CN must equal `identity`; the CN and every DNS SAN must not match the
/// deny list. Also refused: a CN that is not a valid identity, several CNs, a SAN that does
/// not parse.
pub fn validate_csr(csr_pem: &str, identity: &str, deny: &DenyList) -> Result<(), CsrError> {
    let names = csr_names(csr_pem)?;
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
    for name in std::iter::once(&names.common_name).chain(names.dns_names.iter()) {
        if let Some(pattern) = deny.matching_pattern(name) {
            return Err(CsrError::Denied {
                name: name.clone(),
                pattern: pattern.to_string(),
            });
        }
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
        let key_pem = read_vector("tokens/testdata/rsa/signer-key.pem");
        let key = rsa::RsaPrivateKey::from_pkcs1_pem(&key_pem).expect("test key");
        let signer = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(key);
        let name = Name::from_str(subject).expect("subject");
        let mut builder = RequestBuilder::new(name, &signer).expect("builder");
        if !dns.is_empty() {
            let names = dns
                .iter()
                .map(|d| {
                    CertGeneralName::DnsName(
                        x509_cert::der::asn1::Ia5String::new(*d).expect("ia5 name"),
                    )
                })
                .collect();
            builder
                .add_extension(&SubjectAltName(names))
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
            let got = validate_csr(&read_vector(file), identity, &deny);
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
        assert_eq!(validate_csr(&csr, "rip.mcollective", &deny), Ok(()));
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
            let got = validate_csr(&csr, identity, &deny);
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
            let err = validate_csr(input, "node", &deny).expect_err(input);
            assert!(err.to_string().starts_with(prefix), "{input:?}: got {err}");
        }
    }

    #[test]
    fn leading_text_before_the_pem_block_is_skipped_like_go() {
        let csr = format!("garbage before\n{}", make_csr("CN=node1.example.net", &[]));
        assert_eq!(
            validate_csr(&csr, "node1.example.net", &default_deny()),
            Ok(())
        );
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
                    assert_eq!(validate_csr(&csr, id, &deny), Ok(()), "{name}");
                }
                Err(prefix) => {
                    let err = validate_csr(&csr, id, &deny).expect_err(name);
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
