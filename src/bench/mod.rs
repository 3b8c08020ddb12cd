//! Benchmarks against any OpenAI-compatible streaming endpoint: the streaming client and its
//! per-request timings, exact-length prompts, the pp × tg × depth × concurrency grid with
//! llama-benchy and vllm-bench-serve statistics, the correctness / stress / performance
//! levels, and the headless `mxtune bench` command. Definitions: docs/benchmarking.md.

pub mod cli;
pub mod client;
pub mod levels;
pub mod prompt;
pub mod sse;
pub mod stats;
pub mod trace;
pub mod workload;
