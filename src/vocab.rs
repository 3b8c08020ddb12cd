//! The vocabulary every floor shares: what a launch is (`LaunchSpec`, `TargetKind`,
//! `ContainerSpec`, `NetworkMode`, `Mount`, `PathCheck`) and what a readiness probe got back
//! (`ProbeAnswer`). Plain serde data, so the run record stores exactly what ran.
//!
//! This module sits at the bottom of the house: `flags/` renders a `FlagSet` into a
//! `LaunchSpec`, `launch/` consumes it, `record/` stores it, and all of them import it from
//! here. It imports nothing of ours, so no arrow between those floors runs both ways.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What kind of target a launch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetKind {
    /// A vLLM container started through the Docker Engine API.
    Docker,
    /// The bundled engine (`mxtune serve …`) as a child process.
    Engine,
    /// An endpoint that is already running; mxtune only attaches.
    Attach,
    /// vLLM across two hosts: a Ray head and a Ray worker container, `vllm serve` on the head.
    #[serde(rename = "docker-cluster", alias = "docker_cluster")]
    DockerCluster,
}

impl TargetKind {
    /// The name presets and messages use: `docker`, `engine`, `attach`, `docker-cluster`.
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Docker => "docker",
            TargetKind::Engine => "engine",
            TargetKind::Attach => "attach",
            TargetKind::DockerCluster => "docker-cluster",
        }
    }
}

/// A rendered launch: argv + env + (for Docker) the container settings,
/// plus the log checks that decide whether each flag really took effect.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LaunchSpec {
    /// Program and arguments, never a shell string (e.g. `["vllm", "serve", "openai/gpt-oss-120b", …]`
    /// or `["mxtune", "serve", "--synthetic", "tiny", …]`).
    pub argv: Vec<String>,
    /// Environment variables set for the target (ordered for stable output).
    pub env: BTreeMap<String, String>,
    /// Docker-only settings; `None` for the engine and attach targets.
    pub container: Option<ContainerSpec>,
    /// Host and port the target's OpenAI API listens on.
    pub host: String,
    pub port: u16,
    /// Model name the server should list in `/v1/models`.
    pub served_model_name: String,
    /// Kernel-path checks evaluated against the target's logs once it is ready.
    pub checks: Vec<PathCheck>,
    /// Warnings produced while rendering (e.g. a planned-only flag the image may ignore).
    pub warnings: Vec<String>,
    /// Whose names the vLLM argv and env are in, and for which vLLM version; `None` for the
    /// engine and attach targets (and specs written before mxtune recorded it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dialect: Option<Dialect>,
    /// The two nodes of a `docker-cluster` launch; `None` for every other target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterSpec>,
}

/// A two-node vLLM launch over Ray: which hosts, how the model is split, what NCCL should use.
/// The argv of the [`LaunchSpec`] it belongs to is the `vllm serve` run on the head.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterSpec {
    /// The hosts.toml host running the Ray head and `vllm serve`, or `local` (this machine).
    pub head: String,
    /// The hosts.toml host running the Ray worker, or `local`.
    pub worker: String,
    /// `tensor` (`--tensor-parallel-size 2`) or `pipeline` (`--pipeline-parallel-size 2`).
    pub parallel: String,
    /// The Ray head's port (GCS), on the head's address.
    pub ray_port: u16,
    /// How long the worker and its GPU may take to join the Ray cluster, in seconds.
    pub join_limit_s: u64,
    /// The NCCL transport expected between the nodes: `rdma` (IB/RoCE) or `socket`.
    pub transport: String,
    /// NCCL/Gloo/UCX variables the preset sets on both nodes (they override the hosts' own).
    #[serde(default)]
    pub nccl_env: BTreeMap<String, String>,
    /// This machine's address on the link, when `local` is one of two different hosts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_ip: Option<String>,
}

/// The dialect a vLLM launch was rendered in: the image flavour and, for a stock image, the
/// upstream vLLM version its names were chosen for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dialect {
    /// `fork` (the operators' tuning fork) or `upstream` (a stock vLLM image).
    pub flavour: String,
    /// The upstream vLLM version the names were rendered for (stock images only), e.g. `0.11.2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vllm_version: Option<String>,
    /// How that version was known: `vllm --version` (asked of the image before the launch),
    /// or `assumed` when it could not be known and the newest known release was rendered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_source: Option<String>,
    /// Why the version could not be known, when it was assumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Container settings for the Docker target.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContainerSpec {
    pub image: String,
    /// Container name; mxtune picks one when empty.
    pub name: Option<String>,
    /// `host` (as the operators run it) or `bridge` with the port bound to 127.0.0.1.
    pub network: NetworkMode,
    /// `ipc: host`.
    pub ipc_host: bool,
    /// `/dev/shm` size in bytes, when not using the host IPC namespace.
    pub shm_size: Option<u64>,
    /// Ulimits: name → (soft, hard); -1 means unlimited.
    pub ulimits: BTreeMap<String, (i64, i64)>,
    /// Host devices passed through, e.g. `/dev/infiniband`.
    pub devices: Vec<String>,
    /// Added capabilities, e.g. `IPC_LOCK`.
    pub cap_add: Vec<String>,
    /// Request every GPU, the way `--gpus all` does.
    pub gpus_all: bool,
    /// Bind mounts.
    pub mounts: Vec<Mount>,
    /// Files written into the container before it starts (path → contents).
    pub files: BTreeMap<String, String>,
    /// Labels; mxtune adds `mxtune.run_id`, `mxtune.preset`, `mxtune.version`.
    pub labels: BTreeMap<String, String>,
}

/// Docker network mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    Host,
    #[default]
    Bridge,
}

/// A bind mount from the host into the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub host: String,
    pub container: String,
    pub read_only: bool,
}

/// One flag value's evidence rule: log patterns (regexes) that must / must not appear
/// once the target is up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathCheck {
    /// The axis name, e.g. `moe_backend`.
    pub flag: String,
    /// The chosen value, e.g. `marlin`.
    pub value: String,
    pub must_see: Vec<String>,
    pub must_not_see: Vec<String>,
}

/// What one readiness probe that did not prove readiness got back: the request that
/// decided it, and the server's answer or why there was none. The operator watches this
/// while a start is stuck, so it carries the server's own words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeAnswer {
    /// Method and path of the deciding request, e.g. `POST /v1/completions`.
    pub request: String,
    /// HTTP status, when the server answered at all.
    pub status: Option<u16>,
    /// The server's own message (its error text), what was wrong with a 2xx answer, or the
    /// connection error when there was no answer.
    pub message: String,
    /// When the probe finished.
    pub at: DateTime<Utc>,
}

impl ProbeAnswer {
    /// Whether `other` says the same thing (the time aside).
    pub fn same_answer(&self, other: &ProbeAnswer) -> bool {
        self.request == other.request
            && self.status == other.status
            && self.message == other.message
    }

    /// The answer without the request: `503 model is still loading`, or the error.
    pub fn answer(&self) -> String {
        match (self.status, self.message.is_empty()) {
            (Some(code), true) => code.to_string(),
            (Some(code), false) => format!("{code} {}", self.message),
            (None, _) => self.message.clone(),
        }
    }
}

impl std::fmt::Display for ProbeAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} → {}", self.request, self.answer())
    }
}

impl std::error::Error for ProbeAnswer {}
