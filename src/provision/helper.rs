//! Running the operator helper (being written).
