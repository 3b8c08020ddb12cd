//! Launching targets: the Docker vLLM container, the bundled engine, or an attached URL.

pub mod spec;
