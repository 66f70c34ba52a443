//! Choria durations, exactly as go-choria's `ParseDuration` (being written).
