//! One node's provisioning cycle (being written).
pub mod helper;
pub mod version;
