//! The CUDA backend: cudarc (dynamic loading, so nothing here needs a GPU to build), kernels
//! from `engine-kernels/` compiled by NVRTC for the device's own architecture, and the
//! per-kernel CPU references the self-test compares against.

pub mod backend;
pub mod cli;
pub mod clocks;
pub mod compile;
pub mod device;
pub mod gates;
pub mod libs;
pub mod model;
pub mod ops;
pub mod profile;
pub mod quant;
pub mod reference;
pub mod roofline;
pub mod selftest;
pub mod synthetic;
pub mod timeline;
pub mod weights;
