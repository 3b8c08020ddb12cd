//! The bundled gpt-oss inference engine.

pub mod backend;
pub mod config;
pub mod harmony;
pub mod sampling;
pub mod scheduler;
pub mod server;
pub mod tokenizer;
