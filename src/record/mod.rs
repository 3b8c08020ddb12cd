//! record module (being built).
