//! The bundled gpt-oss inference engine.

pub mod backend;
pub mod config;
pub mod cpu;
pub mod loader;
pub mod mxfp4;
pub mod synthetic;
pub mod weights;
