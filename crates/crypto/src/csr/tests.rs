//! The CSR checks against go-choria's vectors and requests built with chosen names.

use super::deny::normalised_name;
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
    #[rustfmt::skip]
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
    #[rustfmt::skip]
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
    let validated = validate_csr(&untidy, ID, &default_deny(), SanKinds::default()).expect("valid");
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
        .map(|d| CertGeneralName::DnsName(x509_cert::der::asn1::Ia5String::new(*d).expect("ia5")))
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
    let csr = csr_with_extension_requests(id, vec![vec![san(&[id])], vec![san(&["evil.choria"])]]);
    let block = pem::parse(&csr).expect("pem");
    let (_, request) = X509CertificationRequest::from_der(block.contents()).expect("csr");
    let first_only = request
        .requested_extensions()
        .map(|extensions| extensions.count())
        .unwrap_or(0);
    assert_eq!(first_only, 1);
}
