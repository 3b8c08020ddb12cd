//! Rendering a `FlagSet` into a `LaunchSpec` for a target: a pure function of its inputs.

use super::axes::{
    Activation, AxisValue, EngineArg, EngineReport, Evidence, MoeBackend, ValueSpec, VllmEffect,
};
use super::dialect::{self, Upstream};
use super::model::{self as m, FlagSet, Setting, VllmFlavor};
use super::names::{NameKind, Provenance, VllmName};
use super::versions::{self, Availability, ImageVersion, NEWEST_KNOWN, VllmVersion};
use crate::vocab::{ContainerSpec, Dialect, LaunchSpec, Mount, NetworkMode, PathCheck, TargetKind};
use anyhow::{Context, Result, anyhow, bail};
use std::collections::BTreeMap;

/// What rendering may read from the outside world, passed in so rendering stays pure.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RenderContext {
    /// The operator's home directory, for `~` in host paths.
    pub home: Option<String>,
    /// The vLLM version of a stock image (`container.vllm = "upstream"`), when known; names
    /// are rendered for [`NEWEST_KNOWN`] otherwise.
    pub vllm_version: Option<ImageVersion>,
    /// Why the version is not known, when someone tried (e.g. `vllm --version` failed).
    pub version_note: Option<String>,
}

impl RenderContext {
    /// Reads `$HOME`.
    pub fn from_env() -> Self {
        RenderContext {
            home: std::env::var("HOME").ok().filter(|h| !h.is_empty()),
            ..RenderContext::default()
        }
    }
}

/// One axis's chosen value with its table row, in a type-erased form.
#[derive(Debug, Clone)]
pub struct AxisChoice {
    /// Axis key, e.g. `moe_backend`.
    pub key: &'static str,
    /// `section.key`, e.g. `axes.moe_backend`.
    pub path: &'static str,
    /// Chosen value name.
    pub value: &'static str,
    /// The value's table row.
    pub spec: ValueSpec,
    /// Engine `kernel-path` key.
    pub engine_key: Option<&'static str>,
    /// Whether the engine's CPU backend has this path.
    pub cpu_applies: bool,
    /// Values that render on vLLM.
    pub vllm_values: Vec<&'static str>,
    /// Values that render on the engine.
    pub engine_values: Vec<&'static str>,
    /// How a stock vLLM image says the value.
    pub upstream: Upstream,
}

fn choice<A: AxisValue>(v: A) -> AxisChoice {
    AxisChoice {
        key: A::KEY,
        path: A::PATH,
        value: v.as_str(),
        spec: v.spec(),
        engine_key: A::ENGINE_KEY,
        cpu_applies: A::CPU_APPLIES,
        vllm_values: A::all()
            .iter()
            .filter(|x| x.spec().vllm.is_some())
            .map(|x| x.as_str())
            .collect(),
        engine_values: A::all()
            .iter()
            .filter(|x| x.spec().engine.is_some())
            .map(|x| x.as_str())
            .collect(),
        upstream: v.upstream(),
    }
}

/// The axis values of a flag set, in table order (the engine `device` last).
pub fn choices(fs: &FlagSet) -> Vec<AxisChoice> {
    let a = &fs.axes;
    vec![
        choice(a.moe_backend),
        choice(a.activation),
        choice(a.tile),
        choice(a.mxfp4_layers),
        choice(a.attention_backend),
        choice(a.sinks),
        choice(a.kv_cache_dtype),
        choice(a.speculative),
        choice(a.cuda_graphs),
    ]
}

/// Renders with the real `$HOME`. See [`render_with`].
pub fn render(fs: &FlagSet, target: TargetKind) -> Result<LaunchSpec> {
    render_with(fs, target, &RenderContext::from_env())
}

/// Renders `fs` for `target`: argv, env, container settings and kernel-path checks.
/// Fails when a value has no rendering on that target or a setting is malformed.
pub fn render_with(fs: &FlagSet, target: TargetKind, ctx: &RenderContext) -> Result<LaunchSpec> {
    match target {
        TargetKind::Docker => render_vllm(fs, ctx),
        TargetKind::DockerCluster => render_cluster(fs, ctx),
        TargetKind::Engine => render_engine(fs, ctx),
        TargetKind::Attach => Ok(LaunchSpec {
            host: client_host(fs.serving.host.as_deref().unwrap_or("127.0.0.1")),
            port: fs.serving.port,
            served_model_name: vllm_served_name(fs),
            ..LaunchSpec::default()
        }),
    }
}

/// The name that stands for this machine in `cluster.head` / `cluster.worker`.
pub const LOCAL_HOST: &str = "local";

/// Log evidence of each NCCL transport between the nodes (NCCL_DEBUG=INFO lines: the network
/// NCCL picked, and the channels' `via NET/…`).
const NCCL_RDMA: &str = r"NCCL INFO (NET/IB : Using \[|Using network IB|Channel .* via NET/IB)";
const NCCL_SOCKET: &str = r"NCCL INFO (NET/Socket : Using \[|Using network Socket|Channel .* via NET/Socket|NET/IB : No device found)";

/// The kernel-path check of the NCCL transport a cluster expects: RDMA must be seen and a
/// socket line must not; a socket cluster only needs its socket lines.
pub fn transport_check(transport: m::Transport) -> PathCheck {
    let (must_see, must_not_see) = match transport {
        m::Transport::Rdma => (vec![NCCL_RDMA.to_string()], vec![NCCL_SOCKET.to_string()]),
        m::Transport::Socket => (vec![NCCL_SOCKET.to_string()], Vec::new()),
    };
    PathCheck {
        flag: "nccl_transport".into(),
        value: transport.as_str().into(),
        must_see,
        must_not_see,
    }
}

/// The transport a log line shows NCCL using between the nodes, if it shows one.
pub fn transport_of_line(line: &str) -> Option<m::Transport> {
    use std::sync::OnceLock;
    static RE: OnceLock<(regex::Regex, regex::Regex)> = OnceLock::new();
    let (rdma, socket) = RE.get_or_init(|| {
        (
            regex::Regex::new(NCCL_RDMA).expect("NCCL_RDMA is a valid regex"),
            regex::Regex::new(NCCL_SOCKET).expect("NCCL_SOCKET is a valid regex"),
        )
    });
    if socket.is_match(line) {
        Some(m::Transport::Socket)
    } else if rdma.is_match(line) {
        Some(m::Transport::Rdma)
    } else {
        None
    }
}

fn check_node_name(key: &str, name: &str) -> Result<()> {
    if name.is_empty() {
        bail!(
            "{key} is not set: a docker-cluster preset names its two hosts (a [[host]] name of hosts.toml, or \"{LOCAL_HOST}\" for this machine) under [cluster]"
        );
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    {
        bail!(
            "{key} = {name:?} is not a host name: give a [[host]] name of hosts.toml or \"{LOCAL_HOST}\""
        );
    }
    Ok(())
}

/// vLLM over Ray on two hosts: the single-host vLLM rendering (the `vllm serve` run on the
/// head), split over both GPUs with the Ray executor, NCCL's own log on, and the transport check.
fn render_cluster(fs: &FlagSet, ctx: &RenderContext) -> Result<LaunchSpec> {
    let cl = &fs.cluster;
    check_node_name("cluster.head", &cl.head)?;
    check_node_name("cluster.worker", &cl.worker)?;
    if cl.head == cl.worker && cl.head != LOCAL_HOST {
        bail!(
            "cluster.head and cluster.worker are both {:?}: the two nodes are two hosts (only \"{LOCAL_HOST}\" may be both, to try the target on one machine)",
            cl.head
        );
    }
    if cl.ray_port == 0 {
        bail!("cluster.ray_port is 0; use Ray's default 6379 or another free port");
    }
    if cl.ray_port == fs.serving.port {
        bail!(
            "cluster.ray_port and serving.port are both {}: the Ray head and the API need their own ports",
            cl.ray_port
        );
    }
    if cl.join_limit_s == 0 {
        bail!("cluster.join_limit_s is 0; give the worker time to join, e.g. 600");
    }
    if fs.container.network != NetworkMode::Host {
        bail!(
            "container.network = \"bridge\": a docker-cluster target needs network = \"host\" (Ray and NCCL talk between the hosts on their own ports)"
        );
    }
    if let Some(tp) = fs.serving.tensor_parallel_size
        && tp > 1
    {
        bail!(
            "serving.tensor_parallel_size = {tp}: a docker-cluster target sets the split itself from cluster.parallel (tensor: --tensor-parallel-size 2, one GPU per host); leave the key out"
        );
    }
    let mut single = fs.clone();
    single.serving.tensor_parallel_size = None;
    let mut spec = render_vllm(&single, ctx)?;
    let split = match cl.parallel {
        m::Parallel::Tensor => "--tensor-parallel-size",
        m::Parallel::Pipeline => "--pipeline-parallel-size",
    };
    spec.argv.extend(
        [split, "2", "--distributed-executor-backend", "ray"]
            .into_iter()
            .map(String::from),
    );
    // NCCL says which transport it picked only at INFO; the check below reads that.
    spec.env
        .entry("NCCL_DEBUG".into())
        .or_insert_with(|| "INFO".into());
    spec.checks.push(transport_check(cl.transport));
    spec.cluster = Some(crate::vocab::ClusterSpec {
        head: cl.head.clone(),
        worker: cl.worker.clone(),
        parallel: cl.parallel.as_str().into(),
        ray_port: cl.ray_port,
        join_limit_s: cl.join_limit_s,
        transport: cl.transport.as_str().into(),
        nccl_env: cl
            .nccl
            .env()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        local_ip: cl.local_ip.clone(),
    });
    Ok(spec)
}

fn vllm_served_name(fs: &FlagSet) -> String {
    fs.serving
        .served_model_name
        .clone()
        .unwrap_or_else(|| fs.serving.model.clone())
}

/// Where a client connects when the server binds `bind`.
fn client_host(bind: &str) -> String {
    match bind {
        "0.0.0.0" | "::" | "" => "127.0.0.1".into(),
        other => other.into(),
    }
}

fn not_on_target(c: &AxisChoice, target: &str, valid: &[&str]) -> anyhow::Error {
    anyhow!(
        "{} = \"{}\" has no {target} rendering; valid on {target}: {}",
        c.path,
        c.value,
        valid.join(", ")
    )
}

fn vllm_arg(argv: &mut Vec<String>, s: &Setting, value: impl ToString) -> Result<()> {
    let name = s
        .vllm
        .ok_or_else(|| anyhow!("setting {}.{} has no vLLM name", s.section, s.key))?;
    argv.push(name.name.to_string());
    argv.push(value.to_string());
    Ok(())
}

struct VllmOut {
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    files: BTreeMap<String, String>,
    used: Vec<&'static VllmName>,
}

fn render_vllm(fs: &FlagSet, ctx: &RenderContext) -> Result<LaunchSpec> {
    let s = &fs.serving;
    if s.model.trim().is_empty() {
        bail!("serving.model is empty; set it to a Hugging Face id such as openai/gpt-oss-120b");
    }
    if s.port == 0 {
        bail!("serving.port is 0; pick a port such as 8000");
    }
    let mut out = VllmOut {
        argv: vec!["vllm".into(), "serve".into(), s.model.clone()],
        env: BTreeMap::new(),
        files: BTreeMap::new(),
        used: Vec::new(),
    };
    if let Some(h) = &s.host {
        vllm_arg(&mut out.argv, &m::S_HOST, h)?;
    }
    vllm_arg(&mut out.argv, &m::S_PORT, s.port)?;
    if let Some(n) = &s.served_model_name {
        vllm_arg(&mut out.argv, &m::S_SERVED_MODEL_NAME, n)?;
    }
    if let Some(q) = &s.quantization {
        vllm_arg(&mut out.argv, &m::S_QUANTIZATION, q)?;
    }
    if let Some(tp) = s.tensor_parallel_size {
        vllm_arg(&mut out.argv, &m::S_TP, tp)?;
    }
    if let Some(g) = s.gpu_memory_utilization {
        if !(g > 0.0 && g <= 1.0) {
            bail!("serving.gpu_memory_utilization = {g} is outside (0, 1]; use e.g. 0.70");
        }
        vllm_arg(&mut out.argv, &m::S_GPU_MEM, g)?;
    }
    if let Some(v) = s.max_model_len {
        vllm_arg(&mut out.argv, &m::S_MAX_MODEL_LEN, v)?;
    }
    if let Some(v) = s.max_num_seqs {
        vllm_arg(&mut out.argv, &m::S_MAX_NUM_SEQS, v)?;
    }
    if let Some(v) = s.max_num_batched_tokens {
        vllm_arg(&mut out.argv, &m::S_MAX_BATCHED, v)?;
    }
    if let Some(v) = s.long_prefill_token_threshold {
        vllm_arg(&mut out.argv, &m::S_LONG_PREFILL, v)?;
    }
    match s.prefix_caching {
        Some(true) => out
            .argv
            .push(super::names::ENABLE_PREFIX_CACHING.name.into()),
        Some(false) => out
            .argv
            .push(super::names::NO_ENABLE_PREFIX_CACHING.name.into()),
        None => {}
    }
    if let Some(f) = &s.load_format {
        vllm_arg(&mut out.argv, &m::S_LOAD_FORMAT, f)?;
    }
    if s.async_scheduling == Some(true) {
        out.argv.push(super::names::ASYNC_SCHEDULING.name.into());
    }

    let mut checks = Vec::new();
    let upstream = fs.container.vllm == VllmFlavor::Upstream;
    let (release, dialect) = dialect_of(fs.container.vllm, ctx);
    for c in choices(fs) {
        if upstream {
            render_upstream(fs, &c, &release, &mut out, &mut checks)?;
            continue;
        }
        let effects = c
            .spec
            .vllm
            .ok_or_else(|| not_on_target(&c, "vLLM", &c.vllm_values))?;
        for e in effects {
            apply_vllm_effect(fs, &c, e, &mut out)?;
        }
        push_check(&mut checks, &c, c.spec.vllm_check);
    }
    if let Some(cfg) = &fs.axes.attention_config {
        let v: serde_json::Value = serde_json::from_str(cfg)
            .with_context(|| format!("axes.attention_config is not valid JSON: {cfg}"))?;
        if !v.is_object() {
            bail!(
                "axes.attention_config must be a JSON object such as {{\"backend\": \"TRITON_ATTN\"}}"
            );
        }
        if upstream
            && let Availability::Missing(since) =
                versions::availability(&super::names::ATTENTION_CONFIG, &release)
        {
            bail!(
                "axes.attention_config cannot be expressed on vLLM {release} (container.vllm = \"upstream\"): --attention-config first appears in vLLM {}; use axes.attention_backend, or an image of vLLM {} or newer",
                versions::release_str(since),
                versions::release_str(since)
            );
        }
        vllm_arg(&mut out.argv, &m::S_ATTENTION_CONFIG, v)?;
    }

    let mut warnings = Vec::new();
    let c = &fs.container;
    for (k, v) in &c.env {
        if let Some(prev) = out.env.get(k)
            && prev != v
        {
            warnings.push(format!(
                "container.env sets {k}={v}, overriding {k}={prev} from the flag axes"
            ));
        }
        out.env.insert(k.clone(), v.clone());
        if let Some(n) = super::names::find(k) {
            out.used.push(n);
        }
    }

    let mut mounts = Vec::new();
    if let Some(hf) = &c.hf_cache {
        mounts.push(Mount {
            host: host_path(hf, "container.hf_cache", ctx)?,
            container: "/root/.cache/huggingface".into(),
            read_only: false,
        });
    }
    if let Some(jit) = &c.jit_cache {
        let base = host_path(jit, "container.jit_cache", ctx)?;
        for (sub, dest) in JIT_CACHES {
            mounts.push(Mount {
                host: format!("{}/{sub}", base.trim_end_matches('/')),
                container: (*dest).into(),
                read_only: false,
            });
        }
    }
    let mut pythonpath = Vec::new();
    for (src, key, dest) in [
        (
            &c.flashinfer_src,
            "container.flashinfer_src",
            "/workspace/flashinfer",
        ),
        (&c.vllm_src, "container.vllm_src", "/workspace/vllm"),
    ] {
        if let Some(p) = src {
            mounts.push(Mount {
                host: host_path(p, key, ctx)?,
                container: dest.into(),
                read_only: false,
            });
            pythonpath.push(dest);
        }
    }
    if !pythonpath.is_empty() {
        let mut pp = pythonpath.join(":");
        if let Some(extra) = out.env.get("PYTHONPATH") {
            pp = format!("{pp}:{extra}");
        }
        out.env.insert("PYTHONPATH".into(), pp);
    }

    for n in dedup(&out.used) {
        match (n.provenance, c.vllm) {
            (Provenance::Planned, _) => warnings.push(format!(
                "{} is planned only (never built): the image may ignore it",
                n.name
            )),
            (Provenance::ForkDeprecated, _) => {
                warnings.push(format!("{} is deprecated in the fork: {}", n.name, n.note))
            }
            (Provenance::Fork, VllmFlavor::Upstream) => warnings.push(match n.kind {
                NameKind::Env => format!(
                    "{} exists only in the tuning fork: this upstream image ignores it",
                    n.name
                ),
                NameKind::Cli => format!(
                    "{} exists only in the tuning fork: upstream vLLM will refuse to start with it",
                    n.name
                ),
            }),
            _ => {}
        }
    }

    let shm_size = c.shm_size.as_deref().map(parse_size).transpose()?;
    let container = ContainerSpec {
        image: c.image.clone(),
        name: c.name.clone(),
        network: c.network,
        ipc_host: c.ipc_host,
        shm_size,
        ulimits: c
            .ulimits
            .iter()
            .map(|(k, v)| (k.clone(), (*v, *v)))
            .collect(),
        devices: if c.rdma {
            vec!["/dev/infiniband".into()]
        } else {
            vec![]
        },
        cap_add: if c.rdma {
            vec!["IPC_LOCK".into()]
        } else {
            vec![]
        },
        gpus_all: c.gpus_all,
        mounts,
        files: out.files,
        labels: BTreeMap::new(),
    };
    if c.image.trim().is_empty() {
        bail!("container.image is empty; name the vLLM image to run");
    }
    Ok(LaunchSpec {
        argv: out.argv,
        env: out.env,
        container: Some(container),
        host: "127.0.0.1".into(),
        port: s.port,
        served_model_name: vllm_served_name(fs),
        checks,
        warnings,
        dialect: Some(dialect),
        cluster: None,
    })
}

/// The release a flag set's names are chosen for, and what the spec records about it.
fn dialect_of(flavour: VllmFlavor, ctx: &RenderContext) -> (VllmVersion, Dialect) {
    if flavour == VllmFlavor::Fork {
        // The fork's names follow the fork, not upstream releases.
        let d = Dialect {
            flavour: "fork".into(),
            ..Dialect::default()
        };
        return (NEWEST_KNOWN, d);
    }
    match &ctx.vllm_version {
        Some(iv) => {
            let note = (iv.version > NEWEST_KNOWN).then(|| {
                format!(
                    "vLLM {} is newer than {NEWEST_KNOWN}, the newest release mxtune's name table was checked against: rendered with that table's names (later releases select the MoE backend with --moe-backend and may ignore the VLLM_*MXFP4* switches)",
                    iv.version
                )
            });
            let d = Dialect {
                flavour: "upstream".into(),
                vllm_version: Some(iv.version.to_string()),
                version_source: Some(iv.source.clone()),
                note,
            };
            (iv.version.clone(), d)
        }
        None => {
            let why = ctx
                .version_note
                .clone()
                .unwrap_or_else(|| "not asked: rendered without Docker".into());
            let d = Dialect {
                flavour: "upstream".into(),
                vllm_version: Some(NEWEST_KNOWN.to_string()),
                version_source: Some("assumed".into()),
                note: Some(format!(
                    "the image's vLLM version is unknown ({why}): rendered for {NEWEST_KNOWN}, the newest release mxtune knows"
                )),
            };
            (NEWEST_KNOWN, d)
        }
    }
}

/// Host subdirectory of `container.jit_cache` → path in the container.
pub const JIT_CACHES: &[(&str, &str)] = &[
    ("flashinfer", "/root/.cache/flashinfer"),
    ("vllm", "/root/.cache/vllm"),
    ("torch", "/root/.cache/torch"),
    ("triton", "/root/.triton"),
];

fn dedup(names: &[&'static VllmName]) -> Vec<&'static VllmName> {
    let mut out: Vec<&'static VllmName> = Vec::new();
    for n in names {
        if !out.iter().any(|o| o.name == n.name) {
            out.push(n);
        }
    }
    out
}

fn apply_vllm_effect(
    fs: &FlagSet,
    c: &AxisChoice,
    e: &VllmEffect,
    out: &mut VllmOut,
) -> Result<()> {
    match e {
        VllmEffect::Env(n, v) => {
            out.env.insert(n.name.into(), (*v).into());
            out.used.push(n);
        }
        VllmEffect::Flag(n) => {
            out.argv.push(n.name.into());
            out.used.push(n);
        }
        VllmEffect::Arg(n, v) => {
            out.argv.push(n.name.into());
            out.argv.push((*v).into());
            out.used.push(n);
        }
        VllmEffect::File(path, contents) => {
            out.files.insert((*path).into(), (*contents).into());
        }
        VllmEffect::SpecConfig { method, drafter } => {
            let mut j = serde_json::Map::new();
            j.insert("method".into(), (*method).into());
            let model = fs.axes.spec_model.as_deref().or(*drafter);
            match (model, *method) {
                (Some(m), _) => {
                    j.insert("model".into(), m.into());
                }
                (None, "eagle3") => bail!(
                    "axes.{} = \"{}\" needs axes.spec_model (the drafter, e.g. {})",
                    c.key,
                    c.value,
                    super::axes::EAGLE3_SHORT
                ),
                (None, _) => {}
            }
            if fs.axes.spec_tokens == 0 {
                bail!("axes.spec_tokens is 0; speculation needs at least 1 token per step");
            }
            j.insert("num_speculative_tokens".into(), fs.axes.spec_tokens.into());
            if *method == "ngram" {
                j.insert("prompt_lookup_max".into(), 5.into());
                j.insert("prompt_lookup_min".into(), 1.into());
            }
            vllm_arg(
                &mut out.argv,
                &m::S_SPEC_TOKENS,
                serde_json::Value::Object(j),
            )?;
            out.used.push(&super::names::SPECULATIVE_CONFIG);
        }
    }
    Ok(())
}

/// One effect in the names of upstream release `v`: as is, through the older name that
/// release reads, dropped (a `=0` for a switch the release does not have: it is off anyway),
/// or refused when the release has no way to say it.
fn apply_for_release(
    fs: &FlagSet,
    c: &AxisChoice,
    e: &VllmEffect,
    v: &VllmVersion,
    out: &mut VllmOut,
) -> Result<()> {
    let (name, value) = match e {
        VllmEffect::Env(n, val) | VllmEffect::Arg(n, val) => (*n, Some(*val)),
        VllmEffect::Flag(n) => (*n, None),
        _ => return apply_vllm_effect(fs, c, e, out),
    };
    match versions::availability(name, v) {
        Availability::Known => apply_vllm_effect(fs, c, e, out),
        Availability::Older(old) => {
            let older = match (old.kind, value) {
                (NameKind::Env, Some(val)) => VllmEffect::Env(old, val),
                (NameKind::Cli, Some(val)) => VllmEffect::Arg(old, val),
                (_, None) => VllmEffect::Flag(old),
            };
            apply_vllm_effect(fs, c, &older, out)
        }
        Availability::Missing(_) if matches!(e, VllmEffect::Env(_, "0")) => Ok(()),
        Availability::Missing(since) => {
            let since = versions::release_str(since);
            bail!(
                "{} = \"{}\" cannot be expressed on vLLM {v} (container.vllm = \"upstream\"): {} first appears in vLLM {since}; nearest upstream value: {} = \"auto\" (or an image of vLLM {since} or newer)",
                c.path,
                c.value,
                name.name,
                c.path.rsplit('.').next().unwrap_or(c.path)
            )
        }
    }
}

/// One axis value in a stock image's own names (see `flags::dialect`), for release `v`
/// (see `flags::versions`).
fn render_upstream(
    fs: &FlagSet,
    c: &AxisChoice,
    v: &VllmVersion,
    out: &mut VllmOut,
    checks: &mut Vec<PathCheck>,
) -> Result<()> {
    let pair = || {
        dialect::upstream_moe(fs.axes.moe_backend, fs.axes.activation).map_err(|n| anyhow!("{n}"))
    };
    if c.key == MoeBackend::KEY {
        let p = pair()?;
        for e in p.effects {
            apply_for_release(fs, c, e, v, out)?;
        }
        push_check(checks, c, p.moe);
        return Ok(());
    }
    if c.key == Activation::KEY {
        push_check(checks, c, pair()?.activation);
        return Ok(());
    }
    match c.upstream {
        Upstream::Not(n) => bail!("{n}"),
        Upstream::Own(effects, ev) => {
            for e in effects {
                apply_for_release(fs, c, e, v, out)?;
            }
            push_check(checks, c, ev);
        }
        Upstream::Same => {
            let effects = c
                .spec
                .vllm
                .ok_or_else(|| not_on_target(c, "vLLM", &c.vllm_values))?;
            for e in effects {
                apply_for_release(fs, c, e, v, out)?;
            }
            push_check(checks, c, c.spec.vllm_check);
        }
    }
    Ok(())
}

fn push_check(checks: &mut Vec<PathCheck>, c: &AxisChoice, ev: Evidence) {
    if ev.must_see.is_empty() && ev.must_not_see.is_empty() {
        return;
    }
    checks.push(PathCheck {
        flag: c.key.into(),
        value: c.value.into(),
        must_see: ev.must_see.iter().map(|s| s.to_string()).collect(),
        must_not_see: ev.must_not_see.iter().map(|s| s.to_string()).collect(),
    });
}

/// Expands `~` and requires an absolute path (Docker bind mounts need one).
fn host_path(p: &str, key: &str, ctx: &RenderContext) -> Result<String> {
    let expanded = if p == "~" || p.starts_with("~/") {
        let home = ctx.home.as_deref().ok_or_else(|| {
            anyhow!("{key} = \"{p}\" uses ~ but HOME is not set; give an absolute path")
        })?;
        format!("{}{}", home.trim_end_matches('/'), &p[1..])
    } else {
        p.to_string()
    };
    if !expanded.starts_with('/') {
        bail!(
            "{key} = \"{p}\" is not an absolute path (Docker bind mounts need one); start it with / or ~/"
        );
    }
    Ok(expanded)
}

/// Parses a Docker-style size (`16g`, `512m`, `1024`) into bytes.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix('b').unwrap_or(&t);
    let (num, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| anyhow!("container.shm_size = \"{s}\" is not a size; use e.g. 16g, 512m"))?;
    n.checked_mul(mult)
        .ok_or_else(|| anyhow!("container.shm_size = \"{s}\" is too large"))
}

fn render_engine(fs: &FlagSet, ctx: &RenderContext) -> Result<LaunchSpec> {
    let s = &fs.serving;
    let e = &fs.engine;
    let mut argv: Vec<String> = vec!["mxtune".into(), "serve".into()];
    let served_default = if let Some(name) = e.model.strip_prefix(m::SYNTHETIC_PREFIX) {
        if name.is_empty() {
            bail!(
                "engine.model = \"{}\" names no synthetic model; use e.g. synthetic:tiny",
                e.model
            );
        }
        argv.extend(["--synthetic".into(), name.to_string()]);
        name.to_string()
    } else {
        if e.model.trim().is_empty() {
            bail!("engine.model is empty; use synthetic:NAME or a checkpoint directory");
        }
        let dir = if e.model.starts_with('~') {
            host_path(&e.model, "engine.model", ctx)?
        } else {
            e.model.clone()
        };
        argv.extend(["--model".into(), dir]);
        std::path::Path::new(&e.model)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| e.model.clone())
    };
    let mut engine_args: Vec<EngineArg> = Vec::new();
    engine_args.extend(e.device.spec().engine.unwrap_or(&[]));
    let host = s.host.clone().unwrap_or_else(|| "127.0.0.1".into());
    let served = s.served_model_name.clone().unwrap_or(served_default);
    let mut push = |flag: Option<&str>, v: String| {
        if let Some(f) = flag {
            argv.push(f.into());
            argv.push(v);
        }
    };
    for EngineArg(f, v) in &engine_args {
        push(Some(f), (*v).into());
    }
    push(m::S_HOST.engine, host.clone());
    push(m::S_PORT.engine, s.port.to_string());
    push(m::S_SERVED_MODEL_NAME.engine, served.clone());
    if let Some(v) = s.max_model_len {
        push(m::S_MAX_MODEL_LEN.engine, v.to_string());
    }
    if let Some(v) = s.max_num_seqs {
        push(m::S_MAX_NUM_SEQS.engine, v.to_string());
    }
    if let Some(v) = s.max_num_batched_tokens {
        push(m::S_MAX_BATCHED.engine, v.to_string());
    }
    if let Some(v) = s.long_prefill_token_threshold {
        push(m::S_LONG_PREFILL.engine, v.to_string());
    }
    if let Some(v) = s.max_waiting_queue_length {
        push(m::S_MAX_WAITING.engine, v.to_string());
    }
    let mut checks = Vec::new();
    if let Some(on) = s.prefix_caching {
        // The same names as vLLM's; the engine's start-up line says which took effect.
        let (flag, said, other) = if on {
            (super::names::ENABLE_PREFIX_CACHING.name, "on", "off")
        } else {
            (super::names::NO_ENABLE_PREFIX_CACHING.name, "off", "on")
        };
        argv.push(flag.into());
        checks.push(PathCheck {
            flag: "serving.prefix_caching".into(),
            value: on.to_string(),
            must_see: vec![format!(r"^mxtune serve: prefix caching {said} \(")],
            must_not_see: vec![format!(r"^mxtune serve: prefix caching {other} \(")],
        });
    }
    if s.port == 0 {
        bail!("serving.port is 0; pick a port such as 8000");
    }

    let mut all = choices(fs);
    all.push(choice(e.device));
    for c in &all {
        let args = c
            .spec
            .engine
            .ok_or_else(|| not_on_target(c, "the engine", &c.engine_values))?;
        if c.key != super::axes::Device::KEY {
            for EngineArg(f, v) in args {
                argv.push((*f).into());
                argv.push((*v).into());
            }
        }
        if let Some(key) = c.engine_key {
            checks.push(engine_check(c, key, e.device));
        }
    }
    Ok(LaunchSpec {
        argv,
        env: BTreeMap::new(),
        container: None,
        host: client_host(&host),
        port: s.port,
        served_model_name: served,
        checks,
        warnings: Vec::new(),
        dialect: None,
        cluster: None,
    })
}

/// The regex for the engine's `kernel-path <key>=<value>` start-up line.
fn engine_check(c: &AxisChoice, key: &str, device: super::axes::Device) -> PathCheck {
    use super::axes::Device;
    let expected = match c.spec.engine_report {
        EngineReport::Exactly(v) => regex::escape(v),
        EngineReport::Any => r"\S+".to_string(),
    };
    let expected = match (c.cpu_applies, device) {
        (true, _) | (false, Device::Cuda) => expected,
        (false, Device::Cpu) => "n/a".to_string(),
        (false, Device::Auto) => format!("(?:{expected}|n/a)"),
    };
    PathCheck {
        flag: c.key.into(),
        value: c.value.into(),
        must_see: vec![format!(r"^kernel-path {key}={expected}(?:\s|$)")],
        must_not_see: vec![],
    }
}

/// The complete `docker run` argv equivalent to a rendered vLLM `LaunchSpec`.
/// Files are written by a `sh -c` wrapper before `exec`ing the real argv.
pub fn docker_run_argv(spec: &LaunchSpec) -> Result<Vec<String>> {
    let c = spec.container.as_ref().ok_or_else(|| {
        anyhow!("this launch has no container settings; render it for the docker target")
    })?;
    let (program, rest) = spec
        .argv
        .split_first()
        .ok_or_else(|| anyhow!("the rendered argv is empty"))?;
    let mut a: Vec<String> = vec!["docker".into(), "run".into(), "--rm".into()];
    if let Some(n) = &c.name {
        a.extend(["--name".into(), n.clone()]);
    }
    if c.gpus_all {
        a.extend(["--gpus".into(), "all".into()]);
    }
    match c.network {
        NetworkMode::Host => a.extend(["--network".into(), "host".into()]),
        NetworkMode::Bridge => a.extend([
            "--network".into(),
            "bridge".into(),
            "-p".into(),
            format!("127.0.0.1:{}:{}", spec.port, spec.port),
        ]),
    }
    if c.ipc_host {
        a.extend(["--ipc".into(), "host".into()]);
    }
    if let Some(s) = c.shm_size {
        a.extend(["--shm-size".into(), s.to_string()]);
    }
    for (k, (soft, hard)) in &c.ulimits {
        a.extend(["--ulimit".into(), format!("{k}={soft}:{hard}")]);
    }
    for d in &c.devices {
        a.extend(["--device".into(), d.clone()]);
    }
    for cap in &c.cap_add {
        a.extend(["--cap-add".into(), cap.clone()]);
    }
    for mnt in &c.mounts {
        let ro = if mnt.read_only { ":ro" } else { "" };
        a.extend(["-v".into(), format!("{}:{}{ro}", mnt.host, mnt.container)]);
    }
    for (k, v) in &spec.env {
        a.extend(["-e".into(), format!("{k}={v}")]);
    }
    for (k, v) in &c.labels {
        a.extend(["--label".into(), format!("{k}={v}")]);
    }
    if c.files.is_empty() {
        a.extend(["--entrypoint".into(), program.clone(), c.image.clone()]);
        a.extend(rest.iter().cloned());
    } else {
        let mut script = String::new();
        for (path, contents) in &c.files {
            let dir = std::path::Path::new(path)
                .parent()
                .map(|p| p.to_string_lossy().into_owned())
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "/".into());
            script.push_str(&format!(
                "mkdir -p {} && printf %s {} > {} && ",
                shell_words::quote(&dir),
                shell_words::quote(contents),
                shell_words::quote(path)
            ));
        }
        script.push_str("exec \"$@\"");
        a.extend([
            "--entrypoint".into(),
            "sh".into(),
            c.image.clone(),
            "-c".into(),
            script,
        ]);
        a.push("mxtune-files".into());
        a.extend(spec.argv.iter().cloned());
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flags::axes::{CudaGraphs, Device, MoeBackend, Tile};

    fn ctx() -> RenderContext {
        RenderContext {
            home: Some("/home/op".into()),
            ..Default::default()
        }
    }

    #[test]
    fn vllm_baseline_argv_env_and_container() {
        let mut fs = FlagSet::default();
        fs.container.vllm = VllmFlavor::Fork;
        fs.axes.moe_backend = MoeBackend::Marlin;
        fs.axes.cuda_graphs = CudaGraphs::Off;
        fs.axes.tile = Tile::T64x128;
        let spec = render_with(&fs, TargetKind::Docker, &ctx()).unwrap();
        assert_eq!(&spec.argv[..3], ["vllm", "serve", "openai/gpt-oss-120b"]);
        assert!(spec.argv.contains(&"--enforce-eager".to_string()));
        assert_eq!(spec.env["VLLM_MXFP4_BACKEND"], "MARLIN");
        assert_eq!(spec.env["FLASHINFER_DEBUG_TILE_OVERRIDE"], "1");
        let c = spec.container.unwrap();
        assert_eq!(c.files["/tmp/flashinfer_moe_tile"], "64x128");
        assert_eq!(c.ulimits["memlock"], (-1, -1));
        assert_eq!(c.ulimits["stack"], (67_108_864, 67_108_864));
        assert!(
            c.mounts
                .iter()
                .any(|m| m.host == "/home/op/.cache/huggingface"
                    && m.container == "/root/.cache/huggingface")
        );
        assert!(
            spec.checks
                .iter()
                .any(|k| k.flag == "moe_backend" && k.must_see == ["(?i)marlin"])
        );
    }

    #[test]
    fn engine_rejects_vllm_only_values_and_checks_kernel_path() {
        let mut fs = FlagSet::default();
        fs.axes.moe_backend = MoeBackend::Marlin;
        let err = render_with(&fs, TargetKind::Engine, &ctx())
            .unwrap_err()
            .to_string();
        assert!(err.contains("moe_backend") && err.contains("gemv"), "{err}");
        fs.axes.moe_backend = MoeBackend::Gemv;
        fs.engine.device = Device::Cuda;
        let spec = render_with(&fs, TargetKind::Engine, &ctx()).unwrap();
        assert_eq!(&spec.argv[..4], ["mxtune", "serve", "--synthetic", "tiny"]);
        let k = spec
            .checks
            .iter()
            .find(|k| k.flag == "moe_backend")
            .unwrap();
        let re = regex::Regex::new(&k.must_see[0]).unwrap();
        assert!(re.is_match("kernel-path moe_kernel=gemv"));
        assert!(!re.is_match("kernel-path moe_kernel=grouped"));
    }
}
