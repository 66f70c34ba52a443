//! The `malformed_messages{kind}` labels of replies the screen refused.

/// Transport, SecureReply or Reply layer broken (JSON, base64, hash, protocol name).
pub const REPLY: &str = "reply";
/// A well-formed reply whose request id or sender is not the one asked.
pub const REPLY_MISMATCH: &str = "reply_mismatch";
/// A reply whose `senderid` is not a valid identity (see `choria_wire::identity`).
pub const REPLY_SENDER: &str = "reply_sender";
/// The Reply's payload is not an MCollective RPC reply.
pub const RPC_REPLY: &str = "rpc_reply";
/// go-choria's lock refusal to an action that takes no lock (`rpcutil#inventory`,
/// `restart`, `shutdown`): no go-choria node sends one. Taken as an ordinary status.
pub const MISPLACED_LOCK_REFUSAL: &str = "misplaced_lock_refusal";
