//! The bundled gpt-oss inference engine.

pub mod backend;
pub mod config;
pub mod cpu;
pub mod cuda;
pub mod harmony;
pub mod loader;
pub mod locate;
pub mod mxfp4;
pub mod prefix;
pub mod sampling;
pub mod scheduler;
pub mod serve;
pub mod server;
pub mod steplog;
pub mod structured;
pub mod synthetic;
pub mod tokenizer;
pub mod weights;
