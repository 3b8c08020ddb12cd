//! tui module (being built).
