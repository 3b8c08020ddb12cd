//! The run-record schema: one `RunRecord` per run, serialized as pretty JSON.
//!
//! Every module fills its part through these types: `launch` the target and observed
//! configuration, `monitor` the GPU facts and resources, `bench` the workload and results,
//! `record` the identity and host environment. Every field is documented in
//! `docs/run-record.md`; a change of shape bumps `SCHEMA_VERSION` and adds a migration in
//! `record::migrate`.

use crate::vocab::{LaunchSpec, TargetKind};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// Schema version written by this build; older versions are migrated on load.
pub const SCHEMA_VERSION: u32 = 1;

/// Value of the top-level `format` key, which tells a run record from any other JSON.
pub const FORMAT_MARKER: &str = "mxtune-run-record";

/// Upper bound on points kept in `Resources::series`, so a 24-hour run stays a small file.
pub const SERIES_MAX_POINTS: usize = 720;

/// One run: what ran, where, how it was configured, what was measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Always `FORMAT_MARKER`.
    pub format: String,
    /// Shape version of this record (see `SCHEMA_VERSION`).
    pub schema_version: u32,
    /// Who/when: run id, timestamps, status.
    pub identity: Identity,
    /// What ran: target kind, preset, flags, launch spec, image or binary, model.
    pub target: TargetInfo,
    /// Where it ran: host, GPUs, source trees, Python packages.
    pub environment: Environment,
    /// What the target actually did: kernel-path verdicts, start-up phases.
    #[serde(default)]
    pub observed: Observed,
    /// Benchmark parameters; `None` when the run measured nothing (launch only).
    #[serde(default)]
    pub workload: Option<WorkloadParams>,
    /// One entry per workload point measured.
    #[serde(default)]
    pub results: Vec<PointResult>,
    /// GPU and host resources over the run; `None` when no monitor ran.
    #[serde(default)]
    pub resources: Option<Resources>,
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`), where the kernel has one.
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

impl RunRecord {
    /// A fresh `running` record with a new run id, started now.
    pub fn new(kind: TargetKind, preset: Option<String>) -> Self {
        let now = Utc::now();
        RunRecord {
            format: FORMAT_MARKER.to_string(),
            schema_version: SCHEMA_VERSION,
            identity: Identity {
                run_id: RunId(ulid::Ulid::from_datetime(now.into())),
                started_at: now,
                updated_at: now,
                ended_at: None,
                status: RunStatus::Running,
                reason: None,
                mxtune_version: env!("CARGO_PKG_VERSION").to_string(),
                mxtune_git_sha: None,
                pid: Some(std::process::id()),
                boot_id: boot_id(),
                note: None,
                tags: Vec::new(),
            },
            target: TargetInfo {
                kind,
                preset,
                ..TargetInfo::default()
            },
            environment: Environment::default(),
            observed: Observed::default(),
            workload: None,
            results: Vec::new(),
            resources: None,
        }
    }

    /// The name shown for this run in tables: the preset, else the target kind.
    pub fn label(&self) -> String {
        match &self.target.preset {
            Some(p) if !p.is_empty() => p.clone(),
            _ => self.target.kind_name().to_string(),
        }
    }
}

/// A run id: a ULID, so ids sort by creation time and are unique without coordination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunId(pub ulid::Ulid);

impl RunId {
    /// A new id for a run starting now.
    pub fn new() -> Self {
        RunId(ulid::Ulid::generate())
    }

    /// The last 8 characters (random part): short enough to type, used in file names.
    pub fn short(&self) -> String {
        let s = self.0.to_string();
        s[s.len() - 8..].to_string()
    }
}

impl Default for RunId {
    fn default() -> Self {
        RunId::new()
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for RunId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ulid::Ulid::from_string(s)
            .map(RunId)
            .map_err(|e| format!("`{s}` is not a run id (26-character ULID): {e}"))
    }
}

impl Serialize for RunId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.to_string())
    }
}

impl<'de> Deserialize<'de> for RunId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Lifecycle state of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// In progress (or mxtune died before it could say otherwise).
    Running,
    /// Finished as planned.
    Completed,
    /// The target or the measurement failed; `Identity::reason` says why.
    Failed,
    /// Stopped by the operator or a signal; results so far are kept.
    Aborted,
}

impl RunStatus {
    /// The lower-case name used in JSON and tables.
    pub fn as_str(&self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Aborted => "aborted",
        }
    }
}

/// Identity of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Identity {
    /// Unique, time-sortable id.
    pub run_id: RunId,
    /// When the run started (UTC).
    pub started_at: DateTime<Utc>,
    /// When the record was last written.
    pub updated_at: DateTime<Utc>,
    /// When the run reached a final status.
    #[serde(default)]
    pub ended_at: Option<DateTime<Utc>>,
    /// Current status.
    pub status: RunStatus,
    /// Why the run failed or was aborted.
    #[serde(default)]
    pub reason: Option<String>,
    /// `CARGO_PKG_VERSION` of the mxtune that wrote the record.
    pub mxtune_version: String,
    /// Git commit of the mxtune build, when known.
    #[serde(default)]
    pub mxtune_git_sha: Option<String>,
    /// Process id of the mxtune that wrote the record (to spot runs whose writer died).
    #[serde(default)]
    pub pid: Option<u32>,
    /// Linux boot id when the record was started: with `pid`, tells a writer that is gone
    /// (another boot, or no such process) from one still running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// Free-text operator note.
    #[serde(default)]
    pub note: Option<String>,
    /// Operator tags.
    #[serde(default)]
    pub tags: Vec<String>,
}

/// Whether the model weights were the real checkpoint or generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Weights {
    /// Real checkpoint weights.
    Real,
    /// Synthetic (random) weights of the model's shape: speed only, output is meaningless.
    Synthetic,
}

/// The target that ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetInfo {
    /// docker, engine or attach.
    pub kind: TargetKind,
    /// Preset name the flag set came from, if any.
    #[serde(default)]
    pub preset: Option<String>,
    /// The full resolved flag set as the flags module serializes it (secrets redacted).
    #[serde(default)]
    pub flags: serde_json::Value,
    /// The exact launch (argv, env, container settings), secrets redacted.
    #[serde(default)]
    pub launch: Option<LaunchSpec>,
    /// Run id of the launch that started the target, when the run did not start it itself
    /// (a bench from the panel against the engine the panel launched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_run: Option<String>,
    /// Base URL of the OpenAI API that was measured.
    #[serde(default)]
    pub url: Option<String>,
    /// Docker image and container facts (docker target only).
    #[serde(default)]
    pub docker: Option<DockerFacts>,
    /// Engine binary facts (engine target only).
    #[serde(default)]
    pub engine: Option<EngineFacts>,
    /// Served model name.
    #[serde(default)]
    pub model: Option<String>,
    /// Real or synthetic weights, when known.
    #[serde(default)]
    pub weights: Option<Weights>,
}

impl Default for TargetInfo {
    fn default() -> Self {
        TargetInfo {
            kind: TargetKind::Attach,
            preset: None,
            flags: serde_json::Value::Null,
            launch: None,
            launch_run: None,
            url: None,
            docker: None,
            engine: None,
            model: None,
            weights: None,
        }
    }
}

impl TargetInfo {
    /// `docker`, `engine`, `attach` or `docker-cluster`.
    pub fn kind_name(&self) -> &'static str {
        self.kind.name()
    }
}

/// Docker image and container identity.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DockerFacts {
    /// Image reference as given (`repo:tag`).
    pub image: String,
    /// Local image id (`sha256:…`).
    #[serde(default)]
    pub image_id: Option<String>,
    /// Repo digest (`repo@sha256:…`), when the image came from a registry.
    #[serde(default)]
    pub digest: Option<String>,
    /// Image labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Container id.
    #[serde(default)]
    pub container_id: Option<String>,
    /// Container name.
    #[serde(default)]
    pub container_name: Option<String>,
}

/// The bundled engine binary that ran.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineFacts {
    /// Path of the executable.
    pub path: String,
    /// Its `--version` output.
    #[serde(default)]
    pub version: Option<String>,
}

/// Where the run happened.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// Host facts (OS, CPU, RAM) of the machine mxtune ran on, or of `remote_host`.
    #[serde(default)]
    pub host: HostFacts,
    /// The hosts.toml host the target ran on (`matrix --host`, `ab --host`): `host`, `gpus`
    /// and `gpu_error` are that host's (its Docker engine's facts and a sample of its own
    /// mxtune monitor). `None`: this machine's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_host: Option<String>,
    /// One entry per GPU, filled from NVML by the monitor.
    #[serde(default)]
    pub gpus: Vec<GpuFacts>,
    /// Why `gpus` is empty or partial (e.g. `NVML not available: …`).
    #[serde(default)]
    pub gpu_error: Option<String>,
    /// Git state of configured source trees (e.g. local vllm and flashinfer checkouts).
    #[serde(default)]
    pub source_repos: Vec<SourceRepo>,
    /// `pip freeze` inside the container (docker target), one requirement per line.
    #[serde(default)]
    pub pip_freeze: Option<Vec<String>>,
    /// `nvidia-smi` output captured inside the container, when present.
    #[serde(default)]
    pub container_nvidia_smi: Option<String>,
    /// Each node of a two-node (`docker-cluster`) target, head first: its host, address,
    /// NCCL environment, container and the Docker host's facts. Empty for other targets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeFacts>,
}

/// One node of a two-node cluster: its host, address, environment and container.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeFacts {
    /// `head` or `worker`.
    pub role: String,
    /// The hosts.toml name, or `local`.
    pub host: String,
    /// The SSH destination of a remote host.
    pub ssh: Option<String>,
    /// The node's address on the link (Ray node IP, `VLLM_HOST_IP`).
    pub address: String,
    /// NCCL, Gloo and UCX variables set on the node.
    pub env: std::collections::BTreeMap<String, String>,
    /// Container name.
    pub container_name: String,
    /// Container id.
    pub container_id: String,
    /// The Docker host's name (`docker info`).
    pub hostname: Option<String>,
    /// The Docker host's operating system.
    pub os: Option<String>,
    /// The Docker host's kernel.
    pub kernel: Option<String>,
    /// The Docker host's architecture.
    pub arch: Option<String>,
    /// The Docker host's CPUs.
    pub cpus: Option<u32>,
    /// The Docker host's memory in bytes.
    pub memory_bytes: Option<u64>,
    /// The Docker engine's version.
    pub docker_version: Option<String>,
    /// `nvidia-smi` inside the node's container.
    pub nvidia_smi: Option<String>,
    /// Facts that could not be collected, and why.
    pub notes: Vec<String>,
}

/// Facts about the host machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostFacts {
    /// Host name.
    #[serde(default)]
    pub hostname: Option<String>,
    /// OS distribution name and version (e.g. `Ubuntu 24.04`).
    #[serde(default)]
    pub os: Option<String>,
    /// Kernel release (`uname -r`).
    #[serde(default)]
    pub kernel: Option<String>,
    /// Full `uname` line: sysname, release, version, machine.
    #[serde(default)]
    pub uname: Option<String>,
    /// CPU architecture (`x86_64`, `aarch64`).
    #[serde(default)]
    pub arch: Option<String>,
    /// CPU model name.
    #[serde(default)]
    pub cpu_model: Option<String>,
    /// Physical cores.
    #[serde(default)]
    pub cpu_cores: Option<usize>,
    /// Logical CPUs (hardware threads).
    #[serde(default)]
    pub cpu_threads: Option<usize>,
    /// Total RAM in bytes.
    #[serde(default)]
    pub ram_total_bytes: Option<u64>,
    /// Total swap in bytes.
    #[serde(default)]
    pub swap_total_bytes: Option<u64>,
}

/// Facts about one GPU; every field is optional because NVML answers NOT_SUPPORTED for
/// some of them on some devices (GB10 has no dedicated memory, for instance).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuFacts {
    /// NVML device index.
    pub index: u32,
    /// Device name.
    #[serde(default)]
    pub name: Option<String>,
    /// Device UUID.
    #[serde(default)]
    pub uuid: Option<String>,
    /// Driver version.
    #[serde(default)]
    pub driver_version: Option<String>,
    /// CUDA version the driver supports (e.g. `13.0`).
    #[serde(default)]
    pub cuda_version: Option<String>,
    /// Compute capability (e.g. `12.1`).
    #[serde(default)]
    pub compute_capability: Option<String>,
    /// Dedicated memory in bytes; `None` on unified-memory devices.
    #[serde(default)]
    pub memory_total_bytes: Option<u64>,
    /// SM clock at capture time, MHz.
    #[serde(default)]
    pub sm_clock_mhz: Option<u32>,
    /// Maximum SM clock, MHz.
    #[serde(default)]
    pub sm_clock_max_mhz: Option<u32>,
    /// Memory clock at capture time, MHz.
    #[serde(default)]
    pub mem_clock_mhz: Option<u32>,
    /// Maximum memory clock, MHz.
    #[serde(default)]
    pub mem_clock_max_mhz: Option<u32>,
    /// Enforced power limit, watts.
    #[serde(default)]
    pub power_limit_w: Option<f64>,
    /// Persistence mode on/off.
    #[serde(default)]
    pub persistence_mode: Option<bool>,
    /// Compute mode (`Default`, `ExclusiveProcess`, `Prohibited`).
    #[serde(default)]
    pub compute_mode: Option<String>,
}

/// Git state of one source tree.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SourceRepo {
    /// Short name (e.g. `vllm`).
    pub name: String,
    /// Path of the checkout (on the host, or inside the container when captured there).
    pub path: String,
    /// `HEAD` commit.
    #[serde(default)]
    pub sha: Option<String>,
    /// Current branch, if not detached.
    #[serde(default)]
    pub branch: Option<String>,
    /// Uncommitted changes present.
    #[serde(default)]
    pub dirty: Option<bool>,
    /// Why the facts above are missing.
    #[serde(default)]
    pub error: Option<String>,
}

/// What the target was seen doing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Observed {
    /// One verdict per checked flag.
    #[serde(default)]
    pub kernel_path: Vec<KernelPathCheck>,
    /// Seconds from launch to ready.
    #[serde(default)]
    pub startup_s: Option<f64>,
    /// Start-up phases in order.
    #[serde(default)]
    pub phases: Vec<Phase>,
    /// Warnings seen (unknown env vars, watchdog, ignored flags).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Target log file, relative to the runs directory.
    #[serde(default)]
    pub log_file: Option<String>,
    /// The vLLM version the target's start-up banner announced (`vLLM API server version X`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vllm_version: Option<String>,
}

/// Did a flag really take effect?
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every must-see pattern matched and no must-not-see pattern did.
    Valid,
    /// A must-not-see pattern matched: another path ran.
    Invalid,
    /// Not enough evidence either way (e.g. a must-see pattern never appeared: the target may
    /// simply not log that path).
    Unknown,
}

/// The kernel-path verdict for one flag value, with the evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelPathCheck {
    /// Axis name, e.g. `moe_backend`.
    pub flag: String,
    /// Chosen value, e.g. `marlin`.
    pub value: String,
    /// The verdict.
    pub verdict: Verdict,
    /// Log lines that decided it.
    #[serde(default)]
    pub lines: Vec<String>,
    /// One-line explanation (e.g. which pattern was missing).
    #[serde(default)]
    pub reason: Option<String>,
}

/// A start-up phase (e.g. `loading weights`) and when it began.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// Phase name.
    pub name: String,
    /// When it began.
    pub at: DateTime<Utc>,
    /// The last readiness probe answer while this was the current phase (none in records
    /// written before mxtune kept it).
    #[serde(default)]
    pub last_probe: Option<crate::vocab::ProbeAnswer>,
}

/// Benchmark parameters (the grid and the request settings).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkloadParams {
    /// `chat` or `completions`.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Prompt lengths (tokens).
    #[serde(default)]
    pub pp: Vec<u32>,
    /// Output lengths (tokens).
    #[serde(default)]
    pub tg: Vec<u32>,
    /// Context depths (tokens before the prompt).
    #[serde(default)]
    pub depth: Vec<u32>,
    /// Concurrency levels.
    #[serde(default)]
    pub concurrency: Vec<u32>,
    /// Measured repetitions per point.
    #[serde(default)]
    pub runs: u32,
    /// Warm-up requests before measuring.
    #[serde(default)]
    pub warmup: u32,
    /// Sampling temperature.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Sampling seed.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Tokenizer used to build exact-length prompts (e.g. `o200k_base`).
    #[serde(default)]
    pub tokenizer: Option<String>,
    /// Server-side prefix caching on/off, when known.
    #[serde(default)]
    pub prefix_caching: Option<bool>,
    /// Unique prompt prefixes so prefix caching cannot help.
    #[serde(default)]
    pub no_cache: bool,
    /// llama-benchy latency mode: `api`, `generation` or `none`.
    #[serde(default)]
    pub latency_mode: Option<String>,
    /// Test level: `correctness`, `stress`, `performance`.
    #[serde(default)]
    pub level: Option<String>,
    /// How output tokens were counted (`usage`, `logprobs`, `token_ids`, `chunks`).
    #[serde(default)]
    pub token_count_method: Option<String>,
}

/// Coordinates of one workload point.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct WorkloadPoint {
    /// Prompt tokens.
    pub pp: u32,
    /// Generated tokens.
    pub tg: u32,
    /// Context depth.
    #[serde(default)]
    pub depth: u32,
    /// Concurrent requests.
    #[serde(default = "one")]
    pub concurrency: u32,
}

fn one() -> u32 {
    1
}

impl WorkloadPoint {
    /// llama-bench style name: `pp2048 tg32`, plus ` @ d4096` and ` c4` when not 0 / 1.
    pub fn label(&self) -> String {
        let mut s = format!("pp{} tg{}", self.pp, self.tg);
        if self.depth > 0 {
            s.push_str(&format!(" @ d{}", self.depth));
        }
        if self.concurrency > 1 {
            s.push_str(&format!(" c{}", self.concurrency));
        }
        s
    }
}

/// Summary of repeated measurements: mean ± sample std over n.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Number of samples.
    pub n: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Sample standard deviation (n − 1); 0 when n = 1.
    pub std: f64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
}

/// Distribution of a latency: mean, std and percentiles (linear interpolation).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatencyStats {
    /// Number of samples.
    pub n: usize,
    /// Mean.
    pub mean: f64,
    /// Sample standard deviation.
    pub std: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// Latency distributions of a point, all in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Start → first token (content or reasoning).
    #[serde(default)]
    pub ttft_ms: Option<LatencyStats>,
    /// Per request (E2EL − TTFT) / (output tokens − 1).
    #[serde(default)]
    pub tpot_ms: Option<LatencyStats>,
    /// Every gap between consecutive token arrivals.
    #[serde(default)]
    pub itl_ms: Option<LatencyStats>,
    /// Start → end of the response.
    #[serde(default)]
    pub e2el_ms: Option<LatencyStats>,
}

/// Results of one workload point.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PointResult {
    /// Which point.
    pub point: WorkloadPoint,
    /// Prompt-processing throughput per repetition, tokens/s.
    #[serde(default)]
    pub pp_tps: Option<Stats>,
    /// Prompt tokens as the server counted them (`usage.prompt_tokens`, the chat template's
    /// tokens included) over the measured requests that reported usage.
    #[serde(default)]
    pub server_prompt_tokens: Option<Stats>,
    /// Prompt-processing throughput by the server's count (`usage.prompt_tokens` / est_ppt
    /// per request, whatever its distance from the tokens sent), tokens/s.
    #[serde(default)]
    pub server_pp_tps: Option<Stats>,
    /// Generation throughput per repetition, tokens/s (per request).
    #[serde(default)]
    pub tg_tps: Option<Stats>,
    /// Aggregate generation throughput over a concurrent batch, tokens/s.
    #[serde(default)]
    pub total_tg_tps: Option<Stats>,
    /// llama-benchy time to first response chunk, ms.
    #[serde(default)]
    pub ttfr_ms: Option<Stats>,
    /// llama-benchy estimated prompt-processing time (ttfr − latency), ms.
    #[serde(default)]
    pub est_ppt_ms: Option<Stats>,
    /// llama-benchy start → first token, ms.
    #[serde(default)]
    pub e2e_ttft_ms: Option<Stats>,
    /// vllm-bench-serve style latency distributions.
    #[serde(default)]
    pub latency: Latency,
    /// Completed requests per second over the point's duration.
    #[serde(default)]
    pub request_throughput: Option<f64>,
    /// Output tokens per second over the point's duration.
    #[serde(default)]
    pub output_throughput: Option<f64>,
    /// (Input + output) tokens per second over the point's duration.
    #[serde(default)]
    pub total_token_throughput: Option<f64>,
    /// Requests sent (measured, excluding warm-up).
    #[serde(default)]
    pub requests: u32,
    /// Requests that ended in an error.
    #[serde(default)]
    pub errors: u32,
    /// Requests that returned fewer tokens than asked.
    #[serde(default)]
    pub early_ended: u32,
    /// Raw per-request timings, so every statistic above can be recomputed.
    #[serde(default)]
    pub requests_raw: Vec<RequestTiming>,
}

/// One token-bearing chunk: (milliseconds after the request started, tokens it carried).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Arrival(pub f64, pub u32);

/// Raw timings of one request; offsets are milliseconds after `start`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestTiming {
    /// Repetition index within the point (0-based).
    #[serde(default)]
    pub run: u32,
    /// A warm-up request (not in the statistics).
    #[serde(default)]
    pub warmup: bool,
    /// Wall-clock time the request was sent.
    pub start: DateTime<Utc>,
    /// First SSE chunk carrying `choices` (may hold no token).
    #[serde(default)]
    pub first_chunk_ms: Option<f64>,
    /// First chunk carrying content or reasoning.
    #[serde(default)]
    pub first_token_ms: Option<f64>,
    /// Every token-bearing chunk in order.
    #[serde(default)]
    pub arrivals: Vec<Arrival>,
    /// Response complete (or failed).
    #[serde(default)]
    pub end_ms: Option<f64>,
    /// llama-benchy latency measured for this repetition, ms.
    #[serde(default)]
    pub latency_ms: Option<f64>,
    /// `usage.prompt_tokens`.
    #[serde(default)]
    pub prompt_tokens: Option<u32>,
    /// `usage.completion_tokens` (or counted tokens when usage is missing).
    #[serde(default)]
    pub completion_tokens: Option<u32>,
    /// Error, when the request failed.
    #[serde(default)]
    pub error: Option<String>,
}

/// Resource use over the run (filled from the monitor's summary).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    /// Samples the summary is based on.
    #[serde(default)]
    pub samples: u64,
    /// Sample rate, Hz.
    #[serde(default)]
    pub rate_hz: Option<f64>,
    /// Peak GPU memory used, bytes.
    #[serde(default)]
    pub gpu_memory_peak_bytes: Option<u64>,
    /// `device` (NVML memory info) or `unified` (/proc/meminfo + process list).
    #[serde(default)]
    pub gpu_memory_source: Option<String>,
    /// Lowest SM clock seen, MHz.
    #[serde(default)]
    pub sm_clock_min_mhz: Option<f64>,
    /// Mean SM clock, MHz.
    #[serde(default)]
    pub sm_clock_mean_mhz: Option<f64>,
    /// Mean power draw, W.
    #[serde(default)]
    pub power_mean_w: Option<f64>,
    /// Highest GPU temperature, °C.
    #[serde(default)]
    pub temp_max_c: Option<f64>,
    /// Throttle / clock-event reasons seen, with when.
    #[serde(default)]
    pub throttle: Vec<ThrottleSeen>,
    /// Mean host CPU utilisation, percent of all cores.
    #[serde(default)]
    pub host_cpu_mean_pct: Option<f64>,
    /// Peak host CPU utilisation, percent.
    #[serde(default)]
    pub host_cpu_max_pct: Option<f64>,
    /// Peak resident memory of the target process, bytes.
    #[serde(default)]
    pub target_rss_peak_bytes: Option<u64>,
    /// Requests the server pre-empted while the run was watched (the growth of vLLM's
    /// `num_preemptions` counter: its KV cache was short for the load); absent when the
    /// server does not export it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_preemptions: Option<u64>,
    /// Downsampled time series, at most `SERIES_MAX_POINTS` points.
    #[serde(default)]
    pub series: Vec<SeriesPoint>,
}

/// A throttle reason and the span it was seen in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThrottleSeen {
    /// Reason name as NVML reports it (e.g. `sw_thermal_slowdown`).
    pub reason: String,
    /// First sample showing it.
    pub first_seen: DateTime<Utc>,
    /// Last sample showing it.
    pub last_seen: DateTime<Utc>,
    /// Samples showing it.
    pub samples: u64,
}

/// One point of the resources time series.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SeriesPoint {
    /// Seconds after the run started.
    pub t_s: f64,
    /// GPU memory used, bytes.
    #[serde(default)]
    pub gpu_mem_bytes: Option<u64>,
    /// SM clock, MHz.
    #[serde(default)]
    pub sm_clock_mhz: Option<f64>,
    /// Power draw, W.
    #[serde(default)]
    pub power_w: Option<f64>,
    /// GPU temperature, °C.
    #[serde(default)]
    pub temp_c: Option<f64>,
    /// GPU utilisation, percent.
    #[serde(default)]
    pub gpu_util_pct: Option<f64>,
    /// Host CPU utilisation, percent.
    #[serde(default)]
    pub host_cpu_pct: Option<f64>,
    /// Target RSS, bytes.
    #[serde(default)]
    pub target_rss_bytes: Option<u64>,
    /// Server-side generation tokens/s from /metrics.
    #[serde(default)]
    pub gen_tps: Option<f64>,
}

impl Resources {
    /// Replace the series with at most `SERIES_MAX_POINTS` points, evenly spread and
    /// always keeping the first and last, so long runs keep their overall shape.
    pub fn set_series(&mut self, points: Vec<SeriesPoint>) {
        self.series = downsample(points, SERIES_MAX_POINTS);
    }
}

/// Keep at most `max` items, picked evenly, first and last included.
pub fn downsample<T>(items: Vec<T>, max: usize) -> Vec<T> {
    let n = items.len();
    if n <= max || max == 0 {
        return if max == 0 { Vec::new() } else { items };
    }
    if max == 1 {
        return items.into_iter().take(1).collect();
    }
    // Index i*(n-1)/(max-1) for i in 0..max: strictly increasing since n > max.
    let mut keep = (0..max).map(|i| i * (n - 1) / (max - 1)).peekable();
    items
        .into_iter()
        .enumerate()
        .filter_map(|(idx, item)| {
            if keep.peek() == Some(&idx) {
                keep.next();
                Some(item)
            } else {
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_written_before_last_probe_was_kept_still_reads() {
        let p: Phase =
            serde_json::from_str(r#"{"name": "loading weights", "at": "2026-01-17T10:00:00Z"}"#)
                .unwrap();
        assert_eq!((p.name.as_str(), p.last_probe), ("loading weights", None));
    }

    #[test]
    fn downsample_bounds_and_keeps_ends() {
        let v: Vec<u32> = (0..10_000).collect();
        let d = downsample(v, 720);
        assert_eq!(d.len(), 720);
        assert_eq!((d[0], d[719]), (0, 9_999));
        assert!(d.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(downsample(vec![1, 2, 3], 10), vec![1, 2, 3]);
        assert_eq!(downsample(vec![1, 2, 3], 1), vec![1]);
        assert!(downsample(vec![1, 2, 3], 0).is_empty());
    }

    #[test]
    fn run_id_round_trips_and_rejects_garbage() {
        let r = RunRecord::new(TargetKind::Engine, Some("tiny".into()));
        let id = r.identity.run_id;
        assert_eq!(id.to_string().parse::<RunId>().unwrap(), id);
        assert_eq!(id.short().len(), 8);
        assert!("not-a-ulid".parse::<RunId>().is_err());
        assert_eq!(r.label(), "tiny");
    }
}
