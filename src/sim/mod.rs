//! The fleet simulator (`choria-fleet-sim`): N Choria Servers in provisioning mode.
