//! The CUDA backend: cudarc (dynamic loading, so nothing here needs a GPU to build), kernels
//! from `engine-kernels/` compiled by NVRTC for the device's own architecture, and the
//! per-kernel CPU references the self-test compares against.

pub mod compile;
pub mod libs;
