//! mxtune: a terminal control panel for tuning gpt-oss inference, plus a bundled MXFP4
//! inference engine. Everything here is usable without a terminal; `main.rs` and `tui/`
//! are thin faces on this library.

pub mod bench;
pub mod engine;
pub mod flags;
pub mod hosts;
pub mod launch;
pub mod matrix;
pub mod monitor;
pub mod output;
pub mod record;
pub mod tui;
pub mod vocab;
