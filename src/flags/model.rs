//! `FlagSet`: one run configuration as plain data, plus the table of its non-axis settings.

use super::axes::{
    Activation, AttentionBackend, CudaGraphs, Device, KvCacheDtype, MoeBackend, Mxfp4Layers, Sinks,
    Speculative, Tile,
};
use super::names::{self, VllmName};
use crate::vocab::{NetworkMode, TargetKind};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A complete run configuration: what a preset resolves to, what the TUI edits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlagSet {
    /// The target this configuration is meant for (`docker` or `engine`).
    pub target: TargetKind,
    /// The orthogonal flag axes.
    pub axes: Axes,
    /// Serving limits and model.
    pub serving: Serving,
    /// Docker container settings (vLLM target only).
    pub container: Container,
    /// Bundled-engine settings (engine target only).
    pub engine: EngineSettings,
    /// The two nodes of a `docker-cluster` target (left out of the file for other targets).
    #[serde(skip_serializing_if = "Cluster::is_unset")]
    pub cluster: Cluster,
}

impl Default for FlagSet {
    fn default() -> Self {
        FlagSet {
            target: TargetKind::Docker,
            axes: Axes::default(),
            serving: Serving::default(),
            container: Container::default(),
            engine: EngineSettings::default(),
            cluster: Cluster::default(),
        }
    }
}

/// The flag axes (see `docs/flags.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Axes {
    /// MoE backend / kernel.
    pub moe_backend: MoeBackend,
    /// MoE activation format.
    pub activation: Activation,
    /// MoE tile.
    pub tile: Tile,
    /// Layers stored as MXFP4.
    pub mxfp4_layers: Mxfp4Layers,
    /// vLLM attention backend.
    pub attention_backend: AttentionBackend,
    /// Raw `--attention-config` JSON object; excludes `attention_backend`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention_config: Option<String>,
    /// Attention sinks.
    pub sinks: Sinks,
    /// KV cache dtype.
    pub kv_cache_dtype: KvCacheDtype,
    /// Speculative decoding method.
    pub speculative: Speculative,
    /// Tokens drafted per step.
    pub spec_tokens: u32,
    /// Drafter model overriding the method's default (required for `eagle3`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec_model: Option<String>,
    /// CUDA graphs.
    pub cuda_graphs: CudaGraphs,
}

impl Default for Axes {
    fn default() -> Self {
        Axes {
            moe_backend: MoeBackend::default(),
            activation: Activation::default(),
            tile: Tile::default(),
            mxfp4_layers: Mxfp4Layers::default(),
            attention_backend: AttentionBackend::default(),
            attention_config: None,
            sinks: Sinks::default(),
            kv_cache_dtype: KvCacheDtype::default(),
            speculative: Speculative::default(),
            spec_tokens: 3,
            spec_model: None,
            cuda_graphs: CudaGraphs::default(),
        }
    }
}

/// Serving limits. `None` leaves the target's own default in place (nothing rendered).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Serving {
    /// vLLM model (Hugging Face id or path inside the container).
    pub model: String,
    /// Name listed by `/v1/models`; defaults to the model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served_model_name: Option<String>,
    /// Bind address; defaults to 0.0.0.0 for vLLM (in a container), 127.0.0.1 for the engine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// API port.
    pub port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// Weight quantization (`mxfp4`).
    pub quantization: Option<String>,
    /// Tensor parallel size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensor_parallel_size: Option<u32>,
    /// Fraction of GPU memory vLLM may take, in (0, 1].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_memory_utilization: Option<f64>,
    /// Context length limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u32>,
    /// Concurrent sequences.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_num_seqs: Option<u32>,
    /// Tokens per scheduler step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_num_batched_tokens: Option<u32>,
    /// Most prompt tokens one request feeds per step (unset: no cap).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub long_prefill_token_threshold: Option<u32>,
    /// Requests that may wait beyond a full batch; one more gets a 503 (bundled engine only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_waiting_queue_length: Option<u32>,
    /// Prefix caching on/off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_caching: Option<bool>,
    /// Weight loader (`auto`, `safetensors`, `fastsafetensors`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_format: Option<String>,
    /// Async scheduling on/off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub async_scheduling: Option<bool>,
}

impl Default for Serving {
    fn default() -> Self {
        Serving {
            model: "openai/gpt-oss-120b".into(),
            served_model_name: None,
            host: None,
            port: 8000,
            quantization: None,
            tensor_parallel_size: None,
            gpu_memory_utilization: None,
            max_model_len: None,
            max_num_seqs: None,
            max_num_batched_tokens: None,
            long_prefill_token_threshold: None,
            max_waiting_queue_length: None,
            prefix_caching: None,
            load_format: None,
            async_scheduling: None,
        }
    }
}

/// Which vLLM the image carries; decides whether fork-only names get a warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VllmFlavor {
    /// The operators' tuning fork (knows the fork names).
    Fork,
    /// Upstream vLLM (ignores fork env vars, rejects fork CLI flags).
    Upstream,
}

/// Docker container settings for the vLLM target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Container {
    /// Image reference.
    pub image: String,
    /// Which vLLM the image carries.
    pub vllm: VllmFlavor,
    /// Container name; mxtune picks one when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `host` (as the operators run it) or `bridge` (port bound to 127.0.0.1).
    pub network: NetworkMode,
    /// Share the host IPC namespace.
    pub ipc_host: bool,
    /// `/dev/shm` size, e.g. `16g` (only meaningful without `ipc_host`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shm_size: Option<String>,
    /// Ulimits, name → value (soft = hard; -1 = unlimited).
    pub ulimits: BTreeMap<String, i64>,
    /// Request every GPU (`--gpus all`).
    pub gpus_all: bool,
    /// Two-Spark RDMA: pass `/dev/infiniband` and add `IPC_LOCK`.
    pub rdma: bool,
    /// Host Hugging Face cache, mounted at /root/.cache/huggingface.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hf_cache: Option<String>,
    /// Host directory holding the JIT caches (flashinfer, vllm, torch, triton subdirectories).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jit_cache: Option<String>,
    /// Local vLLM checkout mounted at /workspace/vllm (added to PYTHONPATH).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vllm_src: Option<String>,
    /// Local FlashInfer checkout mounted at /workspace/flashinfer (added to PYTHONPATH).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flashinfer_src: Option<String>,
    /// Extra environment variables, rendered as given (e.g. FLASHINFER_LOGLEVEL).
    pub env: BTreeMap<String, String>,
}

impl Default for Container {
    fn default() -> Self {
        Container {
            image: "vllm/vllm-openai:latest".into(),
            vllm: VllmFlavor::Upstream,
            name: None,
            network: NetworkMode::Host,
            ipc_host: true,
            shm_size: None,
            ulimits: BTreeMap::from([("memlock".into(), -1), ("stack".into(), 67_108_864)]),
            gpus_all: true,
            rdma: false,
            hf_cache: Some("~/.cache/huggingface".into()),
            jit_cache: Some("~/.cache/mxtune/jit".into()),
            vllm_src: None,
            flashinfer_src: None,
            env: BTreeMap::new(),
        }
    }
}

/// How a `docker-cluster` target splits the model over its two GPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Parallel {
    /// `--tensor-parallel-size 2`: every layer split over both nodes.
    #[default]
    Tensor,
    /// `--pipeline-parallel-size 2`: half the layers on each node.
    Pipeline,
}

impl Parallel {
    /// The name used in presets and the launch spec.
    pub fn as_str(self) -> &'static str {
        match self {
            Parallel::Tensor => "tensor",
            Parallel::Pipeline => "pipeline",
        }
    }
}

/// The NCCL transport a `docker-cluster` target expects between its nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// InfiniBand verbs over the ConnectX-7 link (RoCE): what two Sparks should use.
    #[default]
    Rdma,
    /// TCP sockets (no RDMA): slow, only on purpose.
    Socket,
}

impl Transport {
    /// The name used in presets and the launch spec.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Rdma => "rdma",
            Transport::Socket => "socket",
        }
    }
}

/// NCCL, Gloo and UCX interfaces set on both nodes by the preset (they override each host's
/// `[host.nccl]` table in hosts.toml; a node's own address is per host and stays there).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterNccl {
    /// `NCCL_SOCKET_IFNAME`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket_ifname: Option<String>,
    /// `GLOO_SOCKET_IFNAME`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gloo_socket_ifname: Option<String>,
    /// `NCCL_IB_HCA`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ib_hca: Option<String>,
    /// `UCX_NET_DEVICES`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ucx_net_devices: Option<String>,
}

impl ClusterNccl {
    /// The environment variables these settings stand for, in a fixed order.
    pub fn env(&self) -> Vec<(&'static str, &str)> {
        [
            ("NCCL_SOCKET_IFNAME", &self.socket_ifname),
            ("GLOO_SOCKET_IFNAME", &self.gloo_socket_ifname),
            ("NCCL_IB_HCA", &self.ib_hca),
            ("UCX_NET_DEVICES", &self.ucx_net_devices),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
        .collect()
    }
}

/// The two nodes of a `docker-cluster` target: vLLM over Ray, one GPU on each host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Cluster {
    /// The hosts.toml host for the Ray head and `vllm serve`, or `local` (this machine).
    pub head: String,
    /// The hosts.toml host for the Ray worker, or `local`.
    pub worker: String,
    /// Tensor or pipeline parallel over the two GPUs.
    pub parallel: Parallel,
    /// The Ray head's port.
    pub ray_port: u16,
    /// The NCCL transport expected between the nodes; the other one is a warning.
    pub transport: Transport,
    /// Seconds the worker and its GPU may take to join the Ray cluster.
    pub join_limit_s: u64,
    /// This machine's address on the link, needed when `local` is one of two hosts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_ip: Option<String>,
    /// Interfaces for NCCL, Gloo and UCX on both nodes.
    #[serde(skip_serializing_if = "ClusterNccl::is_empty")]
    pub nccl: ClusterNccl,
}

/// The Ray head port unless a preset says otherwise (Ray's own default).
pub const DEFAULT_RAY_PORT: u16 = 6379;
/// How long the worker may take to join unless a preset says otherwise.
pub const DEFAULT_JOIN_LIMIT_S: u64 = 600;

impl Default for Cluster {
    fn default() -> Self {
        Cluster {
            head: String::new(),
            worker: String::new(),
            parallel: Parallel::default(),
            ray_port: DEFAULT_RAY_PORT,
            transport: Transport::default(),
            join_limit_s: DEFAULT_JOIN_LIMIT_S,
            local_ip: None,
            nccl: ClusterNccl::default(),
        }
    }
}

impl Cluster {
    /// Whether nothing was set (the section is left out of a saved preset).
    pub fn is_unset(&self) -> bool {
        *self == Cluster::default()
    }
}

impl ClusterNccl {
    /// Whether no interface is set.
    pub fn is_empty(&self) -> bool {
        *self == ClusterNccl::default()
    }
}

/// Bundled-engine settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineSettings {
    /// `synthetic:NAME` for a built-in synthetic model, else a checkpoint directory.
    pub model: String,
    /// Device.
    pub device: Device,
}

impl Default for EngineSettings {
    fn default() -> Self {
        EngineSettings {
            model: "synthetic:tiny".into(),
            device: Device::Auto,
        }
    }
}

/// Prefix of `engine.model` naming a synthetic model.
pub const SYNTHETIC_PREFIX: &str = "synthetic:";

/// One non-axis setting: its key, doc, and names per target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// Section in the preset (`serving`, `container`, `engine`, `axes`).
    pub section: &'static str,
    /// Key in that section.
    pub key: &'static str,
    /// One-line doc.
    pub doc: &'static str,
    /// vLLM name, if rendered for vLLM.
    pub vllm: Option<&'static VllmName>,
    /// `mxtune serve` option, if rendered for the engine.
    pub engine: Option<&'static str>,
}

const fn setting(
    section: &'static str,
    key: &'static str,
    doc: &'static str,
    vllm: Option<&'static VllmName>,
    engine: Option<&'static str>,
) -> Setting {
    Setting {
        section,
        key,
        doc,
        vllm,
        engine,
    }
}

/// `axes.attention_config`.
pub const S_ATTENTION_CONFIG: Setting = setting(
    "axes",
    "attention_config",
    "raw --attention-config JSON object, e.g. '{\"backend\": \"TRITON_ATTN\"}'",
    Some(&names::ATTENTION_CONFIG),
    None,
);
/// `axes.spec_tokens`.
pub const S_SPEC_TOKENS: Setting = setting(
    "axes",
    "spec_tokens",
    "num_speculative_tokens in --speculative-config",
    Some(&names::SPECULATIVE_CONFIG),
    None,
);
/// `axes.spec_model`.
pub const S_SPEC_MODEL: Setting = setting(
    "axes",
    "spec_model",
    "drafter (model in --speculative-config); required for eagle3, overrides eagle3-* defaults",
    Some(&names::SPECULATIVE_CONFIG),
    None,
);
/// `serving.model`.
pub const S_MODEL: Setting = setting(
    "serving",
    "model",
    "vLLM model id or path (positional after `vllm serve`)",
    None,
    None,
);
/// `serving.served_model_name`.
pub const S_SERVED_MODEL_NAME: Setting = setting(
    "serving",
    "served_model_name",
    "name in /v1/models (default: the model)",
    Some(&names::SERVED_MODEL_NAME),
    Some("--served-model-name"),
);
/// `serving.host`.
pub const S_HOST: Setting = setting(
    "serving",
    "host",
    "bind address (default 0.0.0.0 in the container, 127.0.0.1 for the engine)",
    Some(&names::HOST),
    Some("--host"),
);
/// `serving.port`.
pub const S_PORT: Setting = setting(
    "serving",
    "port",
    "API port",
    Some(&names::PORT),
    Some("--port"),
);
/// `serving.quantization`.
pub const S_QUANTIZATION: Setting = setting(
    "serving",
    "quantization",
    "weight quantization",
    Some(&names::QUANTIZATION),
    None,
);
/// `serving.tensor_parallel_size`.
pub const S_TP: Setting = setting(
    "serving",
    "tensor_parallel_size",
    "GPUs per replica",
    Some(&names::TENSOR_PARALLEL_SIZE),
    None,
);
/// `serving.gpu_memory_utilization`.
pub const S_GPU_MEM: Setting = setting(
    "serving",
    "gpu_memory_utilization",
    "fraction of GPU memory, (0, 1]",
    Some(&names::GPU_MEMORY_UTILIZATION),
    None,
);
/// `serving.max_model_len`.
pub const S_MAX_MODEL_LEN: Setting = setting(
    "serving",
    "max_model_len",
    "context length limit",
    Some(&names::MAX_MODEL_LEN),
    Some("--max-model-len"),
);
/// `serving.max_num_seqs`.
pub const S_MAX_NUM_SEQS: Setting = setting(
    "serving",
    "max_num_seqs",
    "concurrent sequences",
    Some(&names::MAX_NUM_SEQS),
    Some("--max-num-seqs"),
);
/// `serving.max_num_batched_tokens`.
pub const S_MAX_BATCHED: Setting = setting(
    "serving",
    "max_num_batched_tokens",
    "tokens per scheduler step",
    Some(&names::MAX_NUM_BATCHED_TOKENS),
    Some("--max-num-batched-tokens"),
);
/// `serving.long_prefill_token_threshold`.
pub const S_LONG_PREFILL: Setting = setting(
    "serving",
    "long_prefill_token_threshold",
    "most prompt tokens one request feeds per step (chunked prefill; unset: no cap)",
    Some(&names::LONG_PREFILL_TOKEN_THRESHOLD),
    Some("--long-prefill-token-threshold"),
);
/// `serving.max_waiting_queue_length`.
pub const S_MAX_WAITING: Setting = setting(
    "serving",
    "max_waiting_queue_length",
    "requests waiting beyond a full batch; one more gets a 503 (engine only; unset: no limit)",
    None,
    Some("--max-waiting-queue-length"),
);
/// `serving.prefix_caching`.
pub const S_PREFIX_CACHING: Setting = setting(
    "serving",
    "prefix_caching",
    "true → --enable-prefix-caching, false → --no-enable-prefix-caching",
    Some(&names::ENABLE_PREFIX_CACHING),
    Some("--enable-prefix-caching | --no-enable-prefix-caching"),
);
/// `serving.load_format`.
pub const S_LOAD_FORMAT: Setting = setting(
    "serving",
    "load_format",
    "weight loader",
    Some(&names::LOAD_FORMAT),
    None,
);
/// `serving.async_scheduling`.
pub const S_ASYNC: Setting = setting(
    "serving",
    "async_scheduling",
    "true → --async-scheduling",
    Some(&names::ASYNC_SCHEDULING),
    None,
);
/// `engine.model`.
pub const S_ENGINE_MODEL: Setting = setting(
    "engine",
    "model",
    "`synthetic:NAME` → --synthetic NAME, else a checkpoint dir or a name (`gpt-oss-120b`, found under MXTUNE_MODEL_DIR or in the Hugging Face cache) → --model",
    None,
    Some("--synthetic | --model"),
);

/// Container settings, documented here; the Docker Engine API carries them (no vLLM name).
pub const CONTAINER_SETTINGS: &[(&str, &str)] = &[
    ("image", "image reference"),
    (
        "vllm",
        "`fork` or `upstream`: which vLLM the image carries (fork-only names warn on upstream)",
    ),
    ("name", "container name (mxtune picks one when unset)"),
    (
        "network",
        "`host` (as the operators run it) or `bridge` (port published on 127.0.0.1 only)",
    ),
    ("ipc_host", "share the host IPC namespace (`--ipc host`)"),
    (
        "shm_size",
        "/dev/shm size such as `16g`, when not sharing host IPC",
    ),
    (
        "ulimits",
        "table name → value, soft = hard, -1 = unlimited (memlock -1, stack 67108864)",
    ),
    ("gpus_all", "request every GPU (`--gpus all`)"),
    (
        "rdma",
        "two-Spark RDMA: `/dev/infiniband` device + `IPC_LOCK` capability",
    ),
    ("hf_cache", "host HF cache → /root/.cache/huggingface"),
    (
        "jit_cache",
        "host dir; its flashinfer, vllm, torch, triton subdirs → the container's JIT caches",
    ),
    (
        "vllm_src",
        "local vLLM checkout → /workspace/vllm, prepended to PYTHONPATH",
    ),
    (
        "flashinfer_src",
        "local FlashInfer checkout → /workspace/flashinfer, prepended to PYTHONPATH",
    ),
    ("env", "extra environment variables, rendered verbatim"),
];

/// Every non-axis setting that renders to a flag, for docs.
pub const SETTINGS: &[Setting] = &[
    S_ATTENTION_CONFIG,
    S_SPEC_TOKENS,
    S_SPEC_MODEL,
    S_MODEL,
    S_SERVED_MODEL_NAME,
    S_HOST,
    S_PORT,
    S_QUANTIZATION,
    S_TP,
    S_GPU_MEM,
    S_MAX_MODEL_LEN,
    S_MAX_NUM_SEQS,
    S_MAX_BATCHED,
    S_LONG_PREFILL,
    S_MAX_WAITING,
    S_PREFIX_CACHING,
    S_LOAD_FORMAT,
    S_ASYNC,
    S_ENGINE_MODEL,
];

impl FlagSet {
    /// `section.key = value` pairs of this flag set, as its TOML form spells them.
    pub fn flatten(&self) -> anyhow::Result<Vec<(String, String)>> {
        fn walk(prefix: &str, t: &toml::Table, out: &mut Vec<(String, String)>) {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match v {
                    toml::Value::Table(sub) => walk(&key, sub, out),
                    other => out.push((key, other.to_string())),
                }
            }
        }
        let mut out = Vec::new();
        walk("", &toml::Table::try_from(self)?, &mut out);
        Ok(out)
    }

    /// Keys whose values differ from `other`, sorted: (key, this value, other's value), with
    /// `(unset)` where one side has no such key.
    pub fn diff(&self, other: &FlagSet) -> anyhow::Result<Vec<(String, String, String)>> {
        let (a, b) = (self.flatten()?, other.flatten()?);
        let mut keys: Vec<&String> = a.iter().chain(b.iter()).map(|(k, _)| k).collect();
        keys.sort();
        keys.dedup();
        let get = |f: &[(String, String)], k: &str| {
            f.iter()
                .find(|(x, _)| x == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| "(unset)".into())
        };
        Ok(keys
            .into_iter()
            .filter_map(|k| {
                let (va, vb) = (get(&a, k), get(&b, k));
                (va != vb).then(|| (k.clone(), va, vb))
            })
            .collect())
    }

    /// The value name of axis `key` (`moe_backend`, …, or `device`), for generic editors.
    pub fn axis_value(&self, key: &str) -> Option<&'static str> {
        use super::axes::AxisValue;
        let a = &self.axes;
        Some(match key {
            MoeBackend::KEY => a.moe_backend.as_str(),
            Activation::KEY => a.activation.as_str(),
            Tile::KEY => a.tile.as_str(),
            Mxfp4Layers::KEY => a.mxfp4_layers.as_str(),
            AttentionBackend::KEY => a.attention_backend.as_str(),
            Sinks::KEY => a.sinks.as_str(),
            KvCacheDtype::KEY => a.kv_cache_dtype.as_str(),
            Speculative::KEY => a.speculative.as_str(),
            CudaGraphs::KEY => a.cuda_graphs.as_str(),
            Device::KEY => self.engine.device.as_str(),
            _ => return None,
        })
    }

    /// Sets axis `key` to the value named `value`; the error names the valid keys or values.
    pub fn set_axis(&mut self, key: &str, value: &str) -> Result<(), String> {
        use super::axes::AxisValue;
        let a = &mut self.axes;
        match key {
            MoeBackend::KEY => a.moe_backend = MoeBackend::parse(value)?,
            Activation::KEY => a.activation = Activation::parse(value)?,
            Tile::KEY => a.tile = Tile::parse(value)?,
            Mxfp4Layers::KEY => a.mxfp4_layers = Mxfp4Layers::parse(value)?,
            AttentionBackend::KEY => a.attention_backend = AttentionBackend::parse(value)?,
            Sinks::KEY => a.sinks = Sinks::parse(value)?,
            KvCacheDtype::KEY => a.kv_cache_dtype = KvCacheDtype::parse(value)?,
            Speculative::KEY => a.speculative = Speculative::parse(value)?,
            CudaGraphs::KEY => a.cuda_graphs = CudaGraphs::parse(value)?,
            Device::KEY => self.engine.device = Device::parse(value)?,
            _ => {
                let keys: Vec<&str> = super::axes::all_axes().iter().map(|a| a.key).collect();
                return Err(format!("no axis `{key}`; axes: {}", keys.join(", ")));
            }
        }
        Ok(())
    }
}
