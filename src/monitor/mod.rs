//! monitor module (being built).
