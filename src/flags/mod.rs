//! flags module (being built).
