//! Requests written, and replies read, in the connection's protocol (v1 or v2), with the
//! connection's identity, caller id, ttl and broker hop.

use choria_wire::signing::Protocol;
use choria_wire::v1::{self, client, Filter, ProtocolError};
use choria_wire::v2;

use crate::clock::{unix_now, unix_now_nanos};

use super::Connection;

/// One request as the protocol-independent part of the daemon decides it; the connection adds
/// who sends it, the time, the ttl and the collective, and writes it in its protocol.
pub struct Outgoing<'a> {
    /// The agent the request is for (the v1 `agent`, the v2 `agent` field).
    pub agent: &'a str,
    /// RPC request JSON, or [`v1::DISCOVERY_PING`].
    pub payload: &'a str,
    /// Which nodes should act on it.
    pub filter: &'a Filter,
    /// From [`Connection::new_request_id`].
    pub request_id: &'a str,
}

impl Connection {
    /// The broker URL to record as our `seen-by` hop (go-choria protocol/v1/transport.go,
    /// RecordNetworkHop): known only when one broker is configured, since the crate does not say
    /// which of several it picked.
    pub(crate) fn seen_by_url(&self) -> Option<&str> {
        match self.inner.settings.urls.as_slice() {
            [only] => Some(only.as_str()),
            _ => None,
        }
    }

    /// A fresh request id in the connection's protocol: a UUID without dashes for v1, a KSUID
    /// for v2 (go-choria choria/framework.go, NewRequestID).
    pub fn new_request_id(&self) -> String {
        match self.inner.settings.protocol {
            Protocol::V1(_) => v1::new_request_id(),
            Protocol::V2(_) => v2::new_request_id(unix_now()),
        }
    }

    /// Encodes a request in the connection's protocol the way Go's connector publishes it,
    /// with our `seen-by` (v1) or `trace` (v2) hop when the broker URL is known. v1 carries
    /// the time in seconds, v2 in nanoseconds.
    pub fn encode_request(
        &self,
        request: &Outgoing,
        reply_to: &str,
    ) -> Result<Vec<u8>, ProtocolError> {
        let settings = &self.inner.settings;
        match &settings.protocol {
            Protocol::V1(signer) => {
                let spec = client::RequestSpec {
                    agent: request.agent,
                    message: request.payload,
                    filter: request.filter,
                    ttl: settings.ttl,
                    time: unix_now(),
                    request_id: request.request_id,
                    sender_id: &settings.identity,
                    caller_id: &settings.caller_id,
                    collective: &settings.collective,
                };
                match self.seen_by_url() {
                    Some(url) => client::encode_request_via(&spec, reply_to, signer, url),
                    None => client::encode_request(&spec, reply_to, signer),
                }
            }
            Protocol::V2(signer) => {
                let spec = v2::client::RequestSpec {
                    agent: request.agent,
                    payload: request.payload.as_bytes(),
                    filter: Some(request.filter),
                    ttl: settings.ttl,
                    time: unix_now_nanos(),
                    request_id: request.request_id,
                    sender_id: &settings.identity,
                    caller_id: &settings.caller_id,
                    collective: &settings.collective,
                };
                match self.seen_by_url() {
                    Some(url) => v2::client::encode_request_via(&spec, reply_to, signer, url),
                    None => v2::client::encode_request(&spec, reply_to, signer),
                }
            }
        }
    }

    /// The reply decoder of the connection's protocol, checking every layer and the hash as
    /// go-choria's RPC client does (replies of provisioning-mode servers are unsigned), as a
    /// plain function for code that screens replies on the dispatcher thread.
    pub(crate) fn reply_decoder(&self) -> fn(&[u8]) -> Result<client::Reply, ProtocolError> {
        match self.inner.settings.protocol {
            Protocol::V1(_) => client::decode_reply,
            Protocol::V2(_) => v2::client::decode_reply,
        }
    }

    /// The function that reads a reply's sender header in the connection's protocol, for
    /// code that screens replies away from the connection (the dispatcher thread).
    pub(crate) fn sender_reader(&self) -> fn(&[u8]) -> Result<String, ProtocolError> {
        match self.inner.settings.protocol {
            Protocol::V1(_) => client::transport_sender,
            Protocol::V2(_) => v2::client::transport_sender,
        }
    }
}
