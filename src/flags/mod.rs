//! The flag model: typed axes with their rendering table, `FlagSet`, rendering into a
//! `LaunchSpec`, conflict rules, presets, and the generated `docs/flags.md`.
//!
//! Data flow: `presets/*.toml` → [`preset::PresetStore::load`] → [`FlagSet`] →
//! [`render`] → [`crate::vocab::LaunchSpec`]. [`rules::evaluate`] says what
//! conflicts before launch.

pub mod axes;
pub mod bundled;
pub mod cli;
pub mod dialect;
pub mod docs;
pub mod model;
pub mod names;
pub mod preset;
pub mod render;
pub mod rules;
pub mod versions;

pub use axes::{
    Activation, AttentionBackend, AxisValue, CudaGraphs, Device, KvCacheDtype, MoeBackend,
    Mxfp4Layers, Sinks, Speculative, Tile,
};
pub use model::{Axes, Container, EngineSettings, FlagSet, Serving, VllmFlavor};
pub use render::{RenderContext, docker_run_argv, render, render_with};

#[cfg(test)]
mod tests;
