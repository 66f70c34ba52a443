//! TLS for the broker connection: the files of the `file` provider, and the `choria`
//! provider's modes, including the one that does not verify the broker's certificate.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::ConnectionError;

/// TLS client files for the broker connection.
#[derive(Clone, Debug, PartialEq)]
pub struct TlsFiles {
    /// Our certificate (PEM).
    pub certificate: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The CA the broker's certificate must chain to (PEM).
    pub ca: PathBuf,
}

/// How the connection uses TLS, as the security provider sets it up.
#[derive(Clone, Debug, PartialEq)]
pub enum Tls {
    /// The `file` provider: our certificate and key, and the CA that must have signed the
    /// broker's certificate (name checked); all three required.
    Verified(TlsFiles),
    /// The `choria` provider (go-choria providers/security/choria/choria_security.go,
    /// TLSConfig): a client certificate when both files are given; the CA as the only root
    /// when given, else the broker's certificate is not verified at all, which that security
    /// model does on purpose (the JWTs carry the trust). TLS 1.2 or later either way (rustls
    /// speaks nothing older).
    Choria {
        /// Our certificate and key, when both are configured.
        client: Option<(PathBuf, PathBuf)>,
        /// The only root the broker's certificate may chain to; none: not verified.
        ca: Option<PathBuf>,
    },
}

/// The rustls configuration for the `choria` provider without a CA: the broker's certificate
/// is not verified (go-choria sets InsecureSkipVerify then), but its handshake signature still
/// is, so the session is with whoever holds that certificate's key.
fn unverified_tls_config(
    client: Option<&(PathBuf, PathBuf)>,
) -> Result<nats::rustls::ClientConfig, ConnectionError> {
    use nats::rustls::pki_types::pem::PemObject;
    use nats::rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let provider = Arc::new(nats::rustls::crypto::ring::default_provider());
    let builder = nats::rustls::ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NoServerVerification(provider)));
    let Some((certificate, key)) = client else {
        return Ok(builder.with_no_client_auth());
    };
    let bad = |what: &'static str, path: &Path, reason: String| ConnectionError::TlsFile {
        what,
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidData, reason),
    };
    let chain = CertificateDer::pem_file_iter(certificate)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| bad("certificate", certificate, e.to_string()))?;
    if chain.is_empty() {
        return Err(bad(
            "certificate",
            certificate,
            "no certificate in it".into(),
        ));
    }
    let private_key =
        PrivateKeyDer::from_pem_file(key).map_err(|e| bad("key", key, e.to_string()))?;
    builder
        .with_client_auth_cert(chain, private_key)
        .map_err(|e| bad("key", key, format!("does not go with the certificate: {e}")))
}

/// A server certificate verifier that accepts any certificate (see [`unverified_tls_config`])
/// and checks only the handshake signatures with it.
#[derive(Debug)]
struct NoServerVerification(Arc<nats::rustls::crypto::CryptoProvider>);

impl nats::rustls::client::danger::ServerCertVerifier for NoServerVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &nats::rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[nats::rustls::pki_types::CertificateDer<'_>],
        _server_name: &nats::rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: nats::rustls::pki_types::UnixTime,
    ) -> Result<nats::rustls::client::danger::ServerCertVerified, nats::rustls::Error> {
        Ok(nats::rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &nats::rustls::pki_types::CertificateDer<'_>,
        dss: &nats::rustls::DigitallySignedStruct,
    ) -> Result<nats::rustls::client::danger::HandshakeSignatureValid, nats::rustls::Error> {
        nats::rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &nats::rustls::pki_types::CertificateDer<'_>,
        dss: &nats::rustls::DigitallySignedStruct,
    ) -> Result<nats::rustls::client::danger::HandshakeSignatureValid, nats::rustls::Error> {
        nats::rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<nats::rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn check_readable(what: &'static str, path: &Path) -> Result<(), ConnectionError> {
    std::fs::File::open(path)
        .map(|_| ())
        .map_err(|source| ConnectionError::TlsFile {
            what,
            path: path.to_path_buf(),
            source,
        })
}

/// `options` with the TLS `tls` asks for (none when `None`), after checking that each file it
/// names can be read, so the error names the file rather than a failed handshake.
pub(super) fn with_tls(
    mut options: nats::Options,
    tls: Option<&Tls>,
) -> Result<nats::Options, ConnectionError> {
    match tls {
        None => {}
        Some(Tls::Verified(tls)) => {
            check_readable("certificate", &tls.certificate)?;
            check_readable("key", &tls.key)?;
            check_readable("CA", &tls.ca)?;
            options = options
                .tls_required(true)
                .client_cert(&tls.certificate, &tls.key)
                .add_root_certificate(&tls.ca);
        }
        Some(Tls::Choria {
            client,
            ca: Some(ca),
        }) => {
            check_readable("CA", ca)?;
            options = options.tls_required(true).add_root_certificate(ca);
            if let Some((certificate, key)) = client {
                check_readable("certificate", certificate)?;
                check_readable("key", key)?;
                options = options.client_cert(certificate, key);
            }
        }
        Some(Tls::Choria { client, ca: None }) => {
            options = options
                .tls_required(true)
                .tls_client_config(unverified_tls_config(client.as_ref())?);
        }
    }
    Ok(options)
}
