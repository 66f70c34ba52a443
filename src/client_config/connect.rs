//! The settings the daemon connects to the broker with: Go's forced settings applied, the
//! security provider loaded, the user and password chosen.

use choria_broker::connection::ConnectSettings;
use choria_wire::choria_cfg::{ClientConfig, ClientConfigError, KEY_PROVIDER, PROVISIONER_USER};
use choria_wire::signing::{Protocol, Signer};
use choria_wire::v1::COLLECTIVE;

use super::brokers::Brokers;
#[cfg(test)]
use super::brokers::{find_brokers, Dns};
use super::security::{choria_provider, file_provider, puppet_provider, PuppetEnv, Security};

/// Apply what the Go provisioner forces (cmd/provisioner.go, run) and load the signing material:
/// `insecure` (`choria_insecure`) forces provider `file`, no TLS and unsigned requests;
/// a `provisioning_password` (`broker_provisioning_password`) connects as user `provisioner`.
/// The `choria` provider speaks protocol v2 and presents its client JWT to the
/// broker; `plain_tcp` (ours, for test brokers) drops its TLS. (Tests: the process's own
/// view of Puppet, the brokers found as run finds them.)
#[cfg(test)]
pub(crate) fn connect_settings(
    client: &ClientConfig,
    insecure: bool,
    provisioning_password: Option<&str>,
    plain_tcp: bool,
) -> Result<ConnectSettings, ClientConfigError> {
    connect_settings_in(
        client,
        insecure,
        provisioning_password,
        plain_tcp,
        &PuppetEnv::from_process(),
        &find_brokers(client, &Dns::system()),
    )
}

/// The settings the daemon connects with (what `connect_settings` says), given the `puppet`
/// provider's view of the process and the brokers.
pub(crate) fn connect_settings_in(
    client: &ClientConfig,
    insecure: bool,
    provisioning_password: Option<&str>,
    plain_tcp: bool,
    env: &PuppetEnv,
    brokers: &Brokers,
) -> Result<ConnectSettings, ClientConfigError> {
    let path = &client.path;
    let unsupported = |reason: &'static str| ClientConfigError::UnsupportedProvider {
        path: path.clone(),
        line: client.line_of(KEY_PROVIDER),
        provider: client.security_provider.clone(),
        reason,
    };
    let provider = if insecure {
        "file"
    } else {
        client.security_provider.as_str()
    };
    if plain_tcp && provider != "choria" {
        return Err(unsupported(
            "plain_tcp in the provisioner's configuration needs the choria provider (for a \
             plain test broker with the file provider use choria_insecure)",
        ));
    }
    let security = match provider {
        "file" if insecure => Security {
            tls: None,
            protocol: Protocol::V1(Signer::Insecure),
            token: None,
            caller_id: client.caller_id(),
            token_expires: None,
        },
        "file" => file_provider(client)?,
        "choria" => choria_provider(client, plain_tcp)?,
        // Unset is go-choria's default, puppet.
        "puppet" | "" => puppet_provider(client, env)?,
        "pkcs11" | "certmanager" => {
            return Err(unsupported(
                "this security provider is not supported yet; use puppet, file (x509), choria \
                 (Organization Issuer networks) or choria_insecure",
            ))
        }
        _ => {
            return Err(unsupported(
                "unknown security provider; use puppet, file (x509), choria or choria_insecure",
            ))
        }
    };
    // go-choria sends a user and password only when both are set (choria/connection.go);
    // the provisioner's broker_provisioning_password replaces them (provisioner cmd/run).
    let (user, password) = match (provisioning_password, &client.nats_user, &client.nats_pass) {
        (Some(password), _, _) => (
            Some(PROVISIONER_USER.to_string()),
            Some(password.to_string()),
        ),
        (None, Some(user), Some(password)) => {
            (Some(user.clone()), Some(password.as_str().to_string()))
        }
        (None, _, _) => (None, None),
    };
    Ok(ConnectSettings {
        urls: brokers.urls.clone(),
        user,
        password,
        token: security.token,
        tls: security.tls,
        protocol: security.protocol,
        token_expires: security.token_expires,
        identity: client.identity.clone(),
        caller_id: security.caller_id,
        discovery_timeout: client.discovery_timeout,
        ttl: client.ttl,
        collective: COLLECTIVE.to_string(),
    })
}

/// The production connection's settings (renewal): `client`'s own credentials and brokers,
/// requests to its `main_collective`. `insecure` and `plain_tcp` (test brokers) apply as on
/// the provisioning side; `broker_provisioning_password` does not.
pub(crate) fn production_settings_in(
    client: &ClientConfig,
    insecure: bool,
    plain_tcp: bool,
    env: &PuppetEnv,
    brokers: &Brokers,
) -> Result<ConnectSettings, ClientConfigError> {
    let mut settings = connect_settings_in(client, insecure, None, plain_tcp, env, brokers)?;
    settings.collective = client.main_collective.clone();
    Ok(settings)
}
