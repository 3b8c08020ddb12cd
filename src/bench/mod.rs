//! bench module (being built).
