//! The bundled gpt-oss inference engine.

pub mod backend;
pub mod config;
pub mod cuda;
