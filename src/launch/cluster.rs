//! The two-node vLLM target (`docker-cluster`): a Ray head container on one host, a Ray
//! worker container on another, and `vllm serve … --distributed-executor-backend ray` run in
//! the head container once both nodes and both GPUs have joined.
//!
//! Each node is a [`DockerTarget`] on its host's Docker engine (this machine's, or a hosts.toml
//! host's through an SSH tunnel), created the way the single-host target creates its container.
//! One coordinator task merges both containers' logs and the server's output into the
//! follower's source, asks `ray status` on the head until the worker and its GPU are there
//! (or the join limit passes), starts the server, and reports a node that goes away.
//!
//! A cluster left running by `launch` is followed again with [`ClusterTarget::reattach`]:
//! both containers are found by their labels, and the coordinator starts from a serving
//! cluster (the `vllm serve` exec already running in the head) instead of starting one.

use super::docker::{self, DockerTarget, Found, exec_output, pump_logs};
use super::follow::{Launch, LaunchOptions, SourceMsg};
use super::logbuf::LineSplitter;
use super::ready::ReadyProbe;
use super::target::{NodeFacts, Target, TargetFacts};
use super::{ExitInfo, LaunchEvent, LogStream};
use crate::flags::model::Transport;
use crate::flags::render::{LOCAL_HOST, transport_of_line};
use crate::hosts::Host;
use crate::hosts::ssh::Tunnel;
use crate::vocab::{ClusterSpec, LaunchSpec};
use anyhow::{Context, Result, anyhow, bail};
use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecResults};
use futures::StreamExt;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Label on both containers of a cluster: `head` or `worker`.
pub const LABEL_ROLE: &str = "mxtune.cluster.role";
/// Label on both containers of a cluster: the hosts.toml name of the node's host (or `local`).
pub const LABEL_HOST: &str = "mxtune.cluster.host";

/// How often the head is asked whether the worker has joined.
const JOIN_POLL: Duration = Duration::from_secs(1);

/// A node's part in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Runs the Ray head and `vllm serve`.
    Head,
    /// Runs a Ray worker that gives the cluster its GPU.
    Worker,
}

impl Role {
    /// `head` or `worker`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Head => "head",
            Role::Worker => "worker",
        }
    }
}

/// One node as planned: where it runs, its address on the link, and its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePlan {
    /// Head or worker.
    pub role: Role,
    /// The hosts.toml entry, or `None` for this machine.
    pub host: Option<Host>,
    /// The node's address on the link between the nodes (Ray's node IP, `VLLM_HOST_IP`).
    pub ip: String,
    /// NCCL, Gloo and UCX variables for the node: its host's `[host.nccl]`, then the
    /// preset's `[cluster.nccl]`, then `VLLM_HOST_IP`.
    pub env: BTreeMap<String, String>,
}

impl NodePlan {
    /// The host's name as the preset gives it (`local` for this machine).
    pub fn host_name(&self) -> &str {
        self.host
            .as_ref()
            .map(|h| h.name.as_str())
            .unwrap_or(LOCAL_HOST)
    }
}

/// Both nodes of a cluster launch, resolved against hosts.toml.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterPlan {
    /// The Ray head, which also serves the API.
    pub head: NodePlan,
    /// The Ray worker.
    pub worker: NodePlan,
    /// The spec's cluster section.
    pub spec: ClusterSpec,
}

impl ClusterPlan {
    /// Resolves `spec`'s hosts in the user's hosts.toml (`local` is this machine).
    pub fn from_hosts_file(spec: &ClusterSpec) -> Result<Self> {
        Self::resolve(spec, |n| crate::hosts::find_for(n, "hosts.toml"))
    }

    /// Resolves `spec`'s hosts with `lookup` (hosts.toml; `local` is this machine) and works
    /// out each node's address and environment. Errors say which key or host entry lacks what.
    pub fn resolve(spec: &ClusterSpec, lookup: impl Fn(&str) -> Result<Host>) -> Result<Self> {
        let both_local = spec.head == LOCAL_HOST && spec.worker == LOCAL_HOST;
        let node = |role: Role, name: &str| -> Result<NodePlan> {
            let host = if name == LOCAL_HOST {
                None
            } else {
                Some(
                    lookup(name)
                        .with_context(|| format!("cluster.{} = {name:?}", role.as_str()))?,
                )
            };
            let ip = match &host {
                Some(h) => h.nccl.host_ip.clone().with_context(|| {
                    format!(
                        "host {} ({}) has no host_ip under [host.nccl]: give its address on the link between the two nodes (the Ray node address and VLLM_HOST_IP), e.g. host_ip = \"192.168.200.12\"",
                        h.name, h.defined_at
                    )
                })?,
                None => match (&spec.local_ip, both_local) {
                    (Some(ip), _) => ip.clone(),
                    (None, true) => "127.0.0.1".into(),
                    (None, false) => bail!(
                        "cluster.local_ip is not set: this machine (\"{LOCAL_HOST}\") is the {} of two hosts, so give its address on the link between them (the other node reaches it there)",
                        role.as_str()
                    ),
                },
            };
            let mut env: BTreeMap<String, String> = host
                .as_ref()
                .map(|h| {
                    h.nccl
                        .env()
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect()
                })
                .unwrap_or_default();
            env.extend(spec.nccl_env.clone());
            env.insert("VLLM_HOST_IP".into(), ip.clone());
            Ok(NodePlan {
                role,
                host,
                ip,
                env,
            })
        };
        Ok(ClusterPlan {
            head: node(Role::Head, &spec.head)?,
            worker: node(Role::Worker, &spec.worker)?,
            spec: spec.clone(),
        })
    }

    /// `IP:PORT` of the Ray head.
    pub fn ray_address(&self) -> String {
        format!("{}:{}", self.head.ip, self.spec.ray_port)
    }

    /// The hosts whose Docker engines hold the cluster's containers: `None` is this machine;
    /// one entry when both nodes are on the same host.
    pub fn engines(&self) -> Vec<Option<Host>> {
        let mut out = vec![self.head.host.clone()];
        if self.worker.host != self.head.host {
            out.push(self.worker.host.clone());
        }
        out
    }
}

/// What `ray status` says about the cluster: nodes that are up, and GPUs in all.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RayStatus {
    /// Nodes listed as active (healthy, in older releases).
    pub nodes: usize,
    /// The cluster's total GPUs.
    pub gpus: f64,
}

/// Reads `ray status`: the lines under `Active:` (`Healthy:` before Ray 2.8) in the node
/// section, and the total of the `N/M GPU` usage line.
pub fn parse_ray_status(text: &str) -> RayStatus {
    let mut status = RayStatus::default();
    let mut in_active = false;
    for line in text.lines() {
        let t = line.trim();
        if !line.starts_with(' ') {
            in_active = matches!(t, "Active:" | "Healthy:");
            continue;
        }
        if in_active && !t.is_empty() && !t.starts_with('(') {
            // ` 1 node_3f2a…` — a count, then the node's id or type.
            status.nodes += t
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(1);
        }
        if let Some(usage) = t.strip_suffix(" GPU")
            && let Some((_, total)) = usage.split_once('/')
            && let Ok(total) = total.parse::<f64>()
        {
            // The first GPU line is the cluster's total; per-node sections follow.
            if status.gpus == 0.0 {
                status.gpus = total;
            }
        }
    }
    status
}

/// One node as launched: its plan and its container.
#[derive(Debug)]
pub struct NodeTarget {
    /// Where it runs and with what.
    pub plan: NodePlan,
    /// Its container.
    pub container: DockerTarget,
}

/// A launched two-node cluster.
#[derive(Debug)]
pub struct ClusterTarget {
    /// The Ray head, which serves the API.
    pub head: NodeTarget,
    /// The Ray worker.
    pub worker: NodeTarget,
    /// Base URL of the API (through the head's tunnel when the head is another host).
    pub url: String,
    /// The run id both containers are labelled with (`mxtune.run_id`).
    pub run_id: String,
    /// The SSH tunnels to remote nodes' Docker engines (and the head's API port); they
    /// last as long as the target is followed.
    tunnels: Vec<Tunnel>,
}

/// The argv of a node's container: `ray start` as head or as a worker joining the head.
fn ray_argv(plan: &ClusterPlan, role: Role) -> Vec<String> {
    let mut argv = vec!["ray".to_string(), "start".to_string()];
    match role {
        Role::Head => {
            argv.push("--head".into());
            argv.push(format!("--port={}", plan.spec.ray_port));
        }
        Role::Worker => argv.push(format!("--address={}", plan.ray_address())),
    }
    let ip = match role {
        Role::Head => &plan.head.ip,
        Role::Worker => &plan.worker.ip,
    };
    argv.push(format!("--node-ip-address={ip}"));
    argv.push("--block".into());
    argv
}

/// Both nodes' Docker engines, reached for a launch: this machine's, or a host's through an
/// SSH tunnel (the head's also forwarding the API port), and the API's URL from here.
pub struct ClusterEngines {
    /// The head's engine (where a stock image's version is asked, and the server runs).
    pub head: Docker,
    /// The worker's engine.
    pub worker: Docker,
    /// The API's base URL as seen from this machine.
    pub url: String,
    /// The tunnels the engines (and the API) are reached through; held by the target.
    pub tunnels: Vec<Tunnel>,
    /// The API port the head's forward was opened for.
    pub api_port: u16,
}

impl ClusterEngines {
    /// Reaches both hosts' Docker engines as the plan places the nodes.
    pub async fn connect(plan: &ClusterPlan, spec: &LaunchSpec) -> Result<Self> {
        let mut tunnels = Vec::new();
        let api = (docker::connect_host(&spec.host), spec.port);
        let reach = |node: &NodePlan| {
            format!(
                "reaching host {} (the Ray {})",
                node.host_name(),
                node.role.as_str()
            )
        };
        let (head, t) = docker::connect_on(plan.head.host.as_ref(), Some(api))
            .await
            .with_context(|| reach(&plan.head))?;
        let url = match &t {
            Some(t) => t.url().context("the head's tunnel forwards no port")?,
            None => format!("http://{}:{}", api.0, api.1),
        };
        tunnels.extend(t);
        let (worker, t) = docker::connect_on(plan.worker.host.as_ref(), None)
            .await
            .with_context(|| reach(&plan.worker))?;
        tunnels.extend(t);
        Ok(ClusterEngines {
            head,
            worker,
            url,
            tunnels,
            api_port: spec.port,
        })
    }

    /// Reaches both engines for a launch of `spec` and readies its image: the same image on
    /// both hosts ([`ClusterEngines::check_image`]), a missing stock image pulled on the head
    /// when `allow_pull` (its vLLM release is asked of it), and the preset's `flags` (when the
    /// spec came from a preset) rendered again in the names of that release. Returns the
    /// engines and the spec to launch with [`ClusterTarget::launch_on`]. `mxtune launch`, a
    /// matrix and an A/B start a cluster through here.
    pub async fn connect_for_launch(
        plan: &ClusterPlan,
        spec: &LaunchSpec,
        flags: Option<&crate::flags::FlagSet>,
        allow_pull: bool,
        events: &mpsc::UnboundedSender<LaunchEvent>,
    ) -> Result<(Self, LaunchSpec)> {
        let engines = ClusterEngines::connect(plan, spec).await?;
        let image = spec.container.as_ref().map(|c| c.image.clone());
        if let Some(image) = &image {
            engines.check_image(plan, image, allow_pull).await?;
        }
        let Some(flags) = flags else {
            return Ok((engines, spec.clone()));
        };
        if let Some(image) = image.as_deref()
            && flags.container.vllm == crate::flags::VllmFlavor::Upstream
        {
            // The release is asked of the head's image, so a missing one comes first.
            docker::ensure_image(&engines.head, image, allow_pull, events).await?;
        }
        // Rendered again in the names of the vLLM release the head's image carries.
        let spec = super::dialect::render_for_launch(
            flags,
            crate::vocab::TargetKind::DockerCluster,
            Some(&engines.head),
        )
        .await
        .context("rendering the preset for its image's vLLM release")?;
        Ok((engines, spec))
    }

    /// The run ids of `preset`'s clusters whose Ray head runs where `plan` puts it (a running
    /// container labelled as that run's head for the head's host), newest first (run ids are
    /// ULIDs, which sort by time).
    pub async fn running_clusters(&self, plan: &ClusterPlan, preset: &str) -> Result<Vec<String>> {
        let host = plan.head.host_name();
        let mut runs: Vec<String> = docker::find_mxtune_containers(&self.head)
            .await?
            .into_iter()
            .filter(|f| {
                f.state == "running"
                    && f.preset == preset
                    && f.cluster_role.as_deref() == Some(Role::Head.as_str())
                    && f.cluster_host.as_deref() == Some(host)
            })
            .map(|f| f.run_id)
            .collect();
        runs.sort();
        runs.dedup();
        runs.reverse();
        Ok(runs)
    }

    /// The image must be on both hosts (unless it may be pulled) and be the same image: the
    /// same tag with another image ID on the worker's engine would run another vLLM than the
    /// one the head's was asked for (and NCCL and Ray of two builds). Nothing is started here.
    pub async fn check_image(
        &self,
        plan: &ClusterPlan,
        image: &str,
        allow_pull: bool,
    ) -> Result<()> {
        let mut ids = Vec::new();
        for (d, node) in [(&self.head, &plan.head), (&self.worker, &plan.worker)] {
            match d.inspect_image(image).await {
                Ok(i) => ids.push(i.id.unwrap_or_default()),
                Err(_) if allow_pull => return Ok(()),
                Err(_) => bail!(
                    "image {image} is not present on host {} (the {}): the same image must be on both hosts; copy it there (`docker save {image} | ssh HOST docker load`), build it there, or launch with --pull",
                    node.host_name(),
                    node.role.as_str(),
                ),
            }
        }
        if ids[0] != ids[1] {
            bail!("{}", image_mismatch(plan, image, &ids[0], &ids[1]));
        }
        Ok(())
    }
}

/// `sha256:0123456789ab…` as `docker images` shows it: the first 12 hex digits.
fn short_id(id: &str) -> &str {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    hex.get(..12).unwrap_or(hex)
}

/// `docker ARGS` as typed on this machine for a node's host: here, or through `ssh` (with the
/// host's `ssh -F` file and its engine's socket when not the default).
fn docker_on(node: &NodePlan, args: &str) -> String {
    match &node.host {
        None => format!("docker {args}"),
        Some(h) => {
            let config = h
                .ssh_config
                .as_ref()
                .map(|c| format!("-F {} ", c.display()))
                .unwrap_or_default();
            let socket = if h.docker_socket == crate::hosts::DEFAULT_DOCKER_SOCKET {
                String::new()
            } else {
                format!(
                    "-H unix://{} ",
                    h.docker_socket.trim_start_matches("unix://")
                )
            };
            format!("ssh {config}{} docker {socket}{args}", h.ssh)
        }
    }
}

/// The refusal for one tag that is two images: both hosts and IDs, and how to copy the
/// head's (the one asked for its vLLM release) to the worker's host.
fn image_mismatch(plan: &ClusterPlan, image: &str, head_id: &str, worker_id: &str) -> String {
    format!(
        "image {image} is not the same image on both hosts: on host {} (the head) it is {}, on host {} (the worker) {}; both nodes must run the same image (one build of vLLM, Ray and NCCL): copy the head's to the worker's host with `{} | {}`, or build both from the same source and tag",
        plan.head.host_name(),
        short_id(head_id),
        plan.worker.host_name(),
        short_id(worker_id),
        docker_on(&plan.head, &format!("save {image}")),
        docker_on(&plan.worker, "load"),
    )
}

impl ClusterTarget {
    /// The target of `plan`'s two nodes in their containers (a launch or a re-attach).
    fn new(
        plan: &ClusterPlan,
        head: DockerTarget,
        worker: DockerTarget,
        url: String,
        run_id: String,
        tunnels: Vec<Tunnel>,
    ) -> Self {
        Self {
            head: NodeTarget {
                plan: plan.head.clone(),
                container: head,
            },
            worker: NodeTarget {
                plan: plan.worker.clone(),
                container: worker,
            },
            url,
            run_id,
            tunnels,
        }
    }

    /// Starts the head and worker containers on their hosts and follows the cluster: the
    /// server is started on the head once `ray status` there shows both nodes and both GPUs.
    /// Both engines are reached and the image checked on both ([`ClusterEngines`]) first.
    pub async fn launch(
        plan: ClusterPlan,
        spec: &LaunchSpec,
        opts: &LaunchOptions,
        events: mpsc::UnboundedSender<LaunchEvent>,
    ) -> Result<Launch> {
        let engines = ClusterEngines::connect(&plan, spec).await?;
        let c = docker::container_section(spec, "the docker-cluster target")?;
        engines
            .check_image(&plan, &c.image, opts.allow_pull)
            .await?;
        Self::launch_on(engines, plan, spec, opts, events).await
    }

    /// [`ClusterTarget::launch`] on engines already reached (and checked): the launch renders
    /// a stock image's preset for the vLLM release the head's engine says it carries in between.
    pub async fn launch_on(
        engines: ClusterEngines,
        plan: ClusterPlan,
        spec: &LaunchSpec,
        opts: &LaunchOptions,
        events: mpsc::UnboundedSender<LaunchEvent>,
    ) -> Result<Launch> {
        let c = docker::container_section(spec, "the docker-cluster target")?;
        let ClusterEngines {
            head: head_docker,
            worker: worker_docker,
            url,
            tunnels,
            api_port,
        } = engines;
        if api_port != spec.port {
            bail!(
                "rendering for the image's vLLM release moved the API port from {api_port} to {}: give the port in the preset",
                spec.port
            );
        }
        let base = c
            .name
            .clone()
            .unwrap_or_else(|| docker::default_name(&opts.run_id));
        let node_spec = |node: &NodePlan| {
            let mut s = spec.clone();
            s.argv = ray_argv(&plan, node.role);
            s.env.extend(node.env.clone());
            s
        };
        let node_opts = |node: &NodePlan| {
            let mut o = opts.clone();
            o.remote_host = node.host.as_ref().map(|h| h.name.clone());
            o
        };
        let head = DockerTarget::create_started(
            head_docker,
            &node_spec(&plan.head),
            &node_opts(&plan.head),
            &format!("{base}-head"),
            &[(LABEL_ROLE, "head"), (LABEL_HOST, plan.head.host_name())],
            &events,
        )
        .await
        .with_context(|| format!("starting the Ray head on host {}", plan.head.host_name()))?;
        let worker = DockerTarget::create_started(
            worker_docker,
            &node_spec(&plan.worker),
            &node_opts(&plan.worker),
            &format!("{base}-worker"),
            &[
                (LABEL_ROLE, "worker"),
                (LABEL_HOST, plan.worker.host_name()),
            ],
            &events,
        )
        .await;
        let worker = match worker {
            Ok(w) => w,
            Err(e) => {
                if !opts.keep {
                    let _ = head.remove().await;
                }
                return Err(e.context(format!(
                    "starting the Ray worker on host {}",
                    plan.worker.host_name()
                )));
            }
        };
        let target = ClusterTarget::new(&plan, head, worker, url, opts.run_id.clone(), tunnels);
        target.follow(&plan, spec, None, opts, events)
    }

    /// Follows again the cluster of run `which` (a run id, or one of its containers' names)
    /// that an earlier `launch` left running on the hosts `plan` names: finds the head and
    /// worker containers there by their labels (`mxtune.run_id`, `mxtune.cluster.role`,
    /// `mxtune.cluster.host`), re-opens the head's API forward when the head is another
    /// host, follows both nodes' logs and the `vllm serve` running in the head, and checks
    /// readiness and the kernel-path verdict again. The server's own output cannot be
    /// attached again (it is a Docker exec), so its lines up to then are read back from the
    /// launch's log `RUN.target.log` in `earlier_logs` when it is there; a node that is gone
    /// ends the target as during a launch.
    pub async fn reattach(
        plan: ClusterPlan,
        spec: &LaunchSpec,
        which: &str,
        earlier_logs: Option<&Path>,
        opts: &LaunchOptions,
        events: mpsc::UnboundedSender<LaunchEvent>,
    ) -> Result<Launch> {
        let engines = ClusterEngines::connect(&plan, spec).await?;
        Self::reattach_on(engines, plan, spec, which, earlier_logs, opts, events).await
    }

    /// [`ClusterTarget::reattach`] on engines already reached (the panel first asks them for
    /// the preset's running clusters, [`ClusterEngines::running_clusters`]).
    pub async fn reattach_on(
        engines: ClusterEngines,
        plan: ClusterPlan,
        spec: &LaunchSpec,
        which: &str,
        earlier_logs: Option<&Path>,
        opts: &LaunchOptions,
        events: mpsc::UnboundedSender<LaunchEvent>,
    ) -> Result<Launch> {
        let ClusterEngines {
            head: head_docker,
            worker: worker_docker,
            url,
            tunnels,
            ..
        } = engines;
        let on_head = docker::find_mxtune_containers(&head_docker).await?;
        let on_worker = docker::find_mxtune_containers(&worker_docker).await?;
        let (head_found, worker_found) =
            find_nodes(&plan, &opts.preset, which, &on_head, &on_worker)?;
        let run_id = head_found.run_id.clone();
        let head = DockerTarget::from_found(head_docker, &head_found, url.clone()).await?;
        let worker = DockerTarget::from_found(worker_docker, &worker_found, url.clone()).await?;
        let program = spec.argv.first().cloned().unwrap_or_default();
        let server_exec = running_exec(&head, &program).await?;
        let (replay, note) = read_earlier_server_lines(earlier_logs, &run_id);
        let target = ClusterTarget::new(&plan, head, worker, url, run_id, tunnels);
        let reattach = Reattach {
            server_exec,
            replay,
            note,
        };
        target.follow(&plan, spec, Some(reattach), opts, events)
    }

    /// Starts the coordinator over both nodes and the follower over it.
    fn follow(
        self,
        plan: &ClusterPlan,
        spec: &LaunchSpec,
        reattach: Option<Reattach>,
        opts: &LaunchOptions,
        events: mpsc::UnboundedSender<LaunchEvent>,
    ) -> Result<Launch> {
        let (tx, rx) = mpsc::channel(1024);
        let (head, worker) = (&self.head.container, &self.worker.container);
        let coordinator = Coordinator {
            head: (head.docker.clone(), head.id.clone(), head.name.clone()),
            worker: (
                worker.docker.clone(),
                worker.id.clone(),
                worker.name.clone(),
            ),
            head_host: plan.head.host_name().to_string(),
            worker_host: plan.worker.host_name().to_string(),
            ray_address: plan.ray_address(),
            join_limit: Duration::from_secs(plan.spec.join_limit_s),
            expect: if plan.spec.transport == Transport::Socket.as_str() {
                Transport::Socket
            } else {
                Transport::Rdma
            },
            serve_argv: spec.argv.clone(),
            serve_env: spec
                .env
                .iter()
                .chain(&plan.head.env)
                .map(|(k, v)| format!("{k}={v}"))
                .collect(),
            reattach,
        };
        tokio::spawn(coordinator.run(tx));
        let probe = ReadyProbe::new(
            &self.url,
            &spec.served_model_name,
            opts.api_key.clone(),
            opts.probe_timeout,
        )?;
        let mut opts = opts.clone();
        opts.rendered_for_vllm = spec
            .dialect
            .as_ref()
            .filter(|d| d.flavour == "upstream")
            .and_then(|d| d.vllm_version.clone());
        Launch::follow(
            Target::Cluster(Box::new(self)),
            rx,
            probe,
            &spec.checks,
            &opts,
            events,
        )
    }

    /// `cluster mxtune-… (head on A, worker on B)`.
    pub fn describe(&self) -> String {
        format!(
            "cluster of container {} on host {} (Ray head, API) and container {} on host {} (Ray worker)",
            self.head.container.name,
            self.head.plan.host_name(),
            self.worker.container.name,
            self.worker.plan.host_name()
        )
    }

    /// Stops (and unless `keep` removes) both containers, the worker first; both are tried
    /// even when one fails.
    pub async fn stop(&self, grace: Duration, keep: bool) -> Result<String> {
        let mut done = Vec::new();
        let mut failed = Vec::new();
        for node in [&self.worker, &self.head] {
            match node.container.stop(grace, keep).await {
                Ok(m) => done.push(format!("{m} on host {}", node.plan.host_name())),
                Err(e) => failed.push(format!(
                    "{} node on host {}: {e:#}",
                    node.plan.role.as_str(),
                    node.plan.host_name()
                )),
            }
        }
        if failed.is_empty() {
            Ok(done.join("; "))
        } else {
            Err(anyhow!(
                "stopping the cluster: {}{}",
                failed.join("; "),
                if done.is_empty() {
                    String::new()
                } else {
                    format!(" (done: {})", done.join("; "))
                }
            ))
        }
    }

    /// The head container's facts (image, `pip freeze`, source trees, `nvidia-smi`), and each
    /// node's host, address, NCCL environment, container and Docker host facts.
    pub async fn facts(&self) -> TargetFacts {
        let mut facts = self.head.container.facts().await;
        facts.kind = "docker-cluster".into();
        facts.url = self.url.clone();
        for node in [&self.head, &self.worker] {
            let d = &node.container.docker;
            let mut n = NodeFacts {
                role: node.plan.role.as_str().into(),
                host: node.plan.host_name().into(),
                ssh: node.plan.host.as_ref().map(|h| h.ssh.clone()),
                address: node.plan.ip.clone(),
                env: node.plan.env.clone(),
                container_name: node.container.name.clone(),
                container_id: node.container.id.clone(),
                ..NodeFacts::default()
            };
            match d.info().await {
                Ok(info) => {
                    n.hostname = info.name;
                    n.os = info.operating_system;
                    n.kernel = info.kernel_version;
                    n.arch = info.architecture;
                    n.cpus = info.ncpu.and_then(|c| u32::try_from(c).ok());
                    n.memory_bytes = info.mem_total.and_then(|m| u64::try_from(m).ok());
                    n.docker_version = info.server_version;
                }
                Err(e) => n.notes.push(format!("docker info failed: {e}")),
            }
            n.nvidia_smi = match node.plan.role {
                Role::Head => facts.nvidia_smi.clone(),
                Role::Worker => match exec_output(d, &node.container.id, &["nvidia-smi"]).await {
                    Ok(out) => Some(out),
                    Err(e) => {
                        n.notes
                            .push(format!("nvidia-smi unavailable in the container: {e:#}"));
                        None
                    }
                },
            };
            facts.nodes.push(n);
        }
        facts
    }

    /// How many SSH tunnels the target holds (remote nodes), for messages and tests.
    pub fn tunnels(&self) -> usize {
        self.tunnels.len()
    }
}

/// The head and worker containers of run `which` (a run id or a container name), each on the
/// engine of the host it was started for; the errors say what is missing, where, and what to do.
fn find_nodes(
    plan: &ClusterPlan,
    preset: &str,
    which: &str,
    on_head: &[Found],
    on_worker: &[Found],
) -> Result<(Found, Found)> {
    let (hh, wh) = (plan.head.host_name(), plan.worker.host_name());
    let mut all = on_head
        .iter()
        .map(|f| (hh, f))
        .chain(on_worker.iter().map(|f| (wh, f)));
    let Some((host, first)) = all.find(|(_, f)| f.run_id == which || f.name == which) else {
        bail!(
            "no container of run {which:?} on host {hh} (the Ray head) or host {wh} (the Ray worker): give the run id `mxtune launch` printed last (`… stop with mxtune stop --cluster {preset} RUN_ID`); `docker ps -a --filter label={LABEL_ROLE}` on each host lists the cluster nodes there"
        );
    };
    let run = first.run_id.clone();
    if first.cluster_role.is_none() {
        let on = if host == LOCAL_HOST {
            String::new()
        } else {
            format!(" --host {host}")
        };
        bail!(
            "run {run} on host {host} is a single container ({}, preset {}), not a two-node cluster: re-attach with `mxtune launch{on} --preset {} --reattach {run}`",
            first.name,
            first.preset,
            first.preset
        );
    }
    let node = |list: &[Found], role: Role, host: &str| {
        list.iter()
            .find(|f| {
                f.run_id == run
                    && f.cluster_role.as_deref() == Some(role.as_str())
                    && f.cluster_host.as_deref() == Some(host)
            })
            .cloned()
    };
    match (
        node(on_head, Role::Head, hh),
        node(on_worker, Role::Worker, wh),
    ) {
        (Some(h), Some(w)) => Ok((h, w)),
        (Some(h), None) => bail!(
            "run {run} has its Ray head (container {}) on host {hh}, but no Ray worker container on host {wh}: the worker was removed, so the cluster cannot serve; stop what is left with `mxtune stop --cluster {preset} {run}` and launch again",
            h.name
        ),
        (None, Some(w)) => bail!(
            "run {run} has its Ray worker (container {}) on host {wh}, but no Ray head container on host {hh}: the head (and the server in it) was removed; stop what is left with `mxtune stop --cluster {preset} {run}` and launch again",
            w.name
        ),
        (None, None) => bail!(
            "run {run} was not launched as the Ray head on host {hh} and the Ray worker on host {wh} that preset {preset} names (its container {} is the {} for host {}): re-attach with the preset it was launched with, {}",
            first.name,
            first.cluster_role.as_deref().unwrap_or_default(),
            first.cluster_host.as_deref().unwrap_or("?"),
            first.preset
        ),
    }
}

/// The id of the exec running `program` (the server) in the head container, if one runs.
async fn running_exec(head: &DockerTarget, program: &str) -> Result<Option<String>> {
    let info = head
        .docker
        .inspect_container(&head.id, None)
        .await
        .with_context(|| format!("cannot inspect container {}", head.name))?;
    for id in info.exec_ids.unwrap_or_default() {
        let Ok(e) = head.docker.inspect_exec(&id).await else {
            continue;
        };
        let entrypoint = e
            .process_config
            .as_ref()
            .and_then(|p| p.entrypoint.as_deref());
        if e.running == Some(true) && entrypoint == Some(program) {
            return Ok(Some(id));
        }
    }
    Ok(None)
}

/// The server's lines (and mxtune's own) as the launch of `run` logged them in `dir`; the
/// nodes' own lines (`[head …]`, `[worker …]`) are left out, as their containers' logs give
/// them again. Without the file, a warning saying what the verdict cannot see.
fn read_earlier_server_lines(dir: Option<&Path>, run: &str) -> (Vec<String>, Option<String>) {
    let missing = |why: String| {
        format!(
            "the server's output before this re-attach is not here ({why}): the kernel-path verdict sees only the nodes' own lines; re-attach with the --runs-dir the launch used to read its log back"
        )
    };
    let Some(dir) = dir else {
        return (Vec::new(), Some(missing("no runs directory".into())));
    };
    let path = dir.join(format!("{run}.target.log"));
    match std::fs::read_to_string(&path) {
        Ok(text) => (
            text.lines()
                .filter(|l| !l.starts_with("[head ") && !l.starts_with("[worker "))
                .map(String::from)
                .collect(),
            None,
        ),
        Err(e) => (
            Vec::new(),
            Some(missing(format!("{}: {e}", path.display()))),
        ),
    }
}

/// Where a re-attached coordinator starts: a cluster that serves already.
struct Reattach {
    /// The `vllm serve` exec running in the head container; `None`: the server has ended.
    server_exec: Option<String>,
    /// The server's lines as the launch logged them, passed on first.
    replay: Vec<String>,
    /// Why there are none to replay, as a warning.
    note: Option<String>,
}

/// Passes the launch's server lines on, then watches the running `vllm serve` exec (its
/// output cannot be attached again) until it ends, which is the target's exit.
async fn follow_running_server(
    docker: Docker,
    what: String,
    r: Reattach,
    tx: mpsc::Sender<SourceMsg>,
) {
    if let Some(note) = r.note
        && tx
            .send(SourceMsg::Event(LaunchEvent::Warning { message: note }))
            .await
            .is_err()
    {
        return;
    }
    for line in r.replay {
        if tx
            .send(SourceMsg::Line(LogStream::Combined, line))
            .await
            .is_err()
        {
            return;
        }
    }
    let Some(exec) = r.server_exec else {
        let _ = tx
            .send(SourceMsg::Fail(format!(
                "no vllm serve runs in {what}: the server has ended (the launch's log has its last lines); stop the cluster and launch it again"
            )))
            .await;
        return;
    };
    let line = format!(
        "[mxtune] re-attached: vllm serve runs in {what} (exec {}); its output from here on is not followed (Docker attaches to an exec only when it starts), its end is",
        exec.chars().take(12).collect::<String>()
    );
    if tx
        .send(SourceMsg::Line(LogStream::Combined, line))
        .await
        .is_err()
    {
        return;
    }
    loop {
        tokio::time::sleep(JOIN_POLL).await;
        match docker.inspect_exec(&exec).await {
            Ok(e) if e.running == Some(true) => {}
            Ok(e) => {
                let _ = tx
                    .send(SourceMsg::Exited(ExitInfo {
                        code: e.exit_code,
                        detail: Some("vllm serve in the Ray head container ended".into()),
                        ..ExitInfo::default()
                    }))
                    .await;
                return;
            }
            // The head container is gone: its own log pump reports that.
            Err(_) => return,
        }
    }
}

/// What the coordinator knows to run the cluster.
struct Coordinator {
    head: (Docker, String, String),
    worker: (Docker, String, String),
    head_host: String,
    worker_host: String,
    ray_address: String,
    join_limit: Duration,
    expect: Transport,
    serve_argv: Vec<String>,
    serve_env: Vec<String>,
    /// Following a cluster that already serves (`--reattach`) instead of starting one.
    reattach: Option<Reattach>,
}

/// Ends the `ray status` watch, if there is one.
fn stop_watch(watcher: &Option<tokio::task::JoinHandle<()>>) {
    if let Some(w) = watcher {
        w.abort();
    }
}

/// Where the cluster stands.
enum Stage {
    /// Waiting for the worker and its GPU.
    Joining,
    /// `vllm serve` runs on the head.
    Serving,
    /// The cluster failed before serving; lines and exits are still passed on.
    Failed,
}

impl Coordinator {
    async fn run(mut self, tx: mpsc::Sender<SourceMsg>) {
        let (head_tx, mut head_rx) = mpsc::channel(1024);
        let (worker_tx, mut worker_rx) = mpsc::channel(1024);
        tokio::spawn(pump_logs(self.head.0.clone(), self.head.1.clone(), head_tx));
        tokio::spawn(pump_logs(
            self.worker.0.clone(),
            self.worker.1.clone(),
            worker_tx,
        ));
        let (status_tx, mut status_rx) = mpsc::channel::<Result<RayStatus, String>>(4);
        let (docker, id) = (self.head.0.clone(), self.head.1.clone());
        let address = self.ray_address.clone();
        let (serve_tx, mut serve_rx) = mpsc::channel::<SourceMsg>(1024);
        let mut stage = Stage::Joining;
        let mut watcher = None;
        // A re-attached cluster serves already: no joining to watch, no server to start.
        if let Some(r) = self.reattach.take() {
            stage = Stage::Serving;
            drop(status_tx);
            let what = format!(
                "the Ray head container {} on host {}",
                self.head.2, self.head_host
            );
            tokio::spawn(follow_running_server(docker, what, r, serve_tx.clone()));
        } else {
            watcher = Some(Self::watch_join(docker, id, address, status_tx));
        }
        let started = Instant::now();
        let mut worker_tail: Vec<String> = Vec::new();
        let mut socket_warned = false;
        let (mut head_open, mut worker_open) = (true, true);
        let send = |m: SourceMsg| {
            let tx = tx.clone();
            async move { tx.send(m).await.is_ok() }
        };
        loop {
            let (msg, from) = tokio::select! {
                m = head_rx.recv(), if head_open => (m, Role::Head),
                m = worker_rx.recv(), if worker_open => (m, Role::Worker),
                m = serve_rx.recv(), if matches!(stage, Stage::Serving) => match m {
                    Some(SourceMsg::Line(stream, line)) => {
                        if let Some(w) = self.transport_warning(&line, &mut socket_warned)
                            && !send(SourceMsg::Event(LaunchEvent::Warning { message: w })).await
                        {
                            break;
                        }
                        if !send(SourceMsg::Line(stream, line)).await {
                            break;
                        }
                        continue;
                    }
                    Some(SourceMsg::Exited(exit)) => {
                        let _ = send(SourceMsg::Exited(exit)).await;
                        break;
                    }
                    Some(other) => {
                        if !send(other).await {
                            break;
                        }
                        continue;
                    }
                    None => continue,
                },
                s = status_rx.recv(), if matches!(stage, Stage::Joining) => {
                    let Some(s) = s else { continue };
                    let joined = matches!(&s, Ok(r) if r.nodes >= 2 && r.gpus >= 2.0);
                    if joined {
                        stop_watch(&watcher);
                        let line = format!(
                            "[mxtune] Ray cluster at {} has both nodes and both GPUs (head on host {}, worker on host {}): starting the server",
                            self.ray_address, self.head_host, self.worker_host
                        );
                        if !send(SourceMsg::Line(LogStream::Combined, line)).await {
                            break;
                        }
                        match self.start_server(serve_tx.clone()).await {
                            Ok(()) => stage = Stage::Serving,
                            Err(e) => {
                                stage = Stage::Failed;
                                let _ = send(SourceMsg::Fail(format!(
                                    "cannot start the server in the Ray head container {} on host {}: {e:#}",
                                    self.head.2, self.head_host
                                ))).await;
                            }
                        }
                    } else if started.elapsed() > self.join_limit {
                        stop_watch(&watcher);
                        stage = Stage::Failed;
                        let _ = send(SourceMsg::Fail(self.join_failure(&s, &worker_tail))).await;
                    }
                    continue;
                }
                else => break,
            };
            match (msg, from) {
                (Some(SourceMsg::Line(stream, line)), role) => {
                    let host = match role {
                        Role::Head => &self.head_host,
                        Role::Worker => &self.worker_host,
                    };
                    let line = format!("[{} {host}] {line}", role.as_str());
                    if role == Role::Worker {
                        worker_tail.push(line.clone());
                        if worker_tail.len() > 5 {
                            worker_tail.remove(0);
                        }
                    }
                    if !send(SourceMsg::Line(stream, line)).await {
                        break;
                    }
                }
                (Some(SourceMsg::Exited(exit)), Role::Head) => {
                    let detail = format!(
                        "the Ray head container {} on host {} exited ({exit})",
                        self.head.2, self.head_host
                    );
                    let _ = send(SourceMsg::Exited(ExitInfo {
                        detail: Some(detail),
                        ..exit
                    }))
                    .await;
                    break;
                }
                (Some(SourceMsg::Exited(exit)), Role::Worker) => {
                    let what = format!(
                        "the Ray worker container {} on host {} exited ({exit})",
                        self.worker.2, self.worker_host
                    );
                    match stage {
                        Stage::Joining => {
                            stop_watch(&watcher);
                            stage = Stage::Failed;
                            let _ = send(SourceMsg::Fail(format!(
                                "{what} before it joined the Ray cluster at {}",
                                self.ray_address
                            )))
                            .await;
                        }
                        Stage::Serving => {
                            let message = format!(
                                "{what}: the server on host {} has lost the worker's GPU and cannot serve; the head is left as it is for its logs (stop the cluster to remove both)",
                                self.head_host
                            );
                            let _ = send(SourceMsg::Event(LaunchEvent::Warning {
                                message: message.clone(),
                            }))
                            .await;
                            let _ = send(SourceMsg::Exited(ExitInfo {
                                detail: Some(what),
                                ..exit
                            }))
                            .await;
                            break;
                        }
                        Stage::Failed => {}
                    }
                }
                (Some(other), _) => {
                    if !send(other).await {
                        break;
                    }
                }
                (None, role) => {
                    // A pump ended after its exit was passed on; the other goes on.
                    match role {
                        Role::Head => head_open = false,
                        Role::Worker => worker_open = false,
                    }
                    if !head_open && !worker_open {
                        break;
                    }
                }
            }
        }
        stop_watch(&watcher);
    }

    /// Asks `ray status` on the head every [`JOIN_POLL`] and sends each answer.
    fn watch_join(
        docker: Docker,
        id: String,
        address: String,
        status_tx: mpsc::Sender<Result<RayStatus, String>>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(JOIN_POLL).await;
                let cmd = ["ray", "status", &format!("--address={address}")];
                let answer = exec_output(&docker, &id, &cmd)
                    .await
                    .map(|out| parse_ray_status(&out))
                    .map_err(|e| format!("{e:#}"));
                if status_tx.send(answer).await.is_err() {
                    return;
                }
            }
        })
    }

    /// A warning the first time a line shows NCCL on the transport not expected.
    fn transport_warning(&self, line: &str, warned: &mut bool) -> Option<String> {
        if *warned || self.expect != Transport::Rdma {
            return None;
        }
        if transport_of_line(line) != Some(Transport::Socket) {
            return None;
        }
        *warned = true;
        Some(format!(
            "NCCL between host {} and host {} fell back to sockets (no RDMA): tensor-parallel traffic goes over TCP and runs far slower; check NCCL_IB_HCA in [host.nccl], container.rdma = true (/dev/infiniband, IPC_LOCK) and `ibv_devinfo` on both hosts (line: {})",
            self.head_host,
            self.worker_host,
            line.trim()
        ))
    }

    /// Why the cluster never had both nodes: the last `ray status` and the worker's last lines.
    fn join_failure(&self, last: &Result<RayStatus, String>, tail: &[String]) -> String {
        let status = match last {
            Ok(s) => format!("{} node(s), {} GPU(s)", s.nodes, s.gpus),
            Err(e) => format!("`ray status` failed: {e}"),
        };
        let tail = if tail.is_empty() {
            "it logged nothing".to_string()
        } else {
            format!("its last lines: {}", tail.join(" | "))
        };
        format!(
            "the Ray worker on host {} (container {}) did not join the Ray cluster at {} within the join limit of {} s (ray status on the head: {status}); check that host {} reaches {} (firewall, host_ip in [host.nccl] or cluster.local_ip) and that its GPU is visible in the container; {tail}",
            self.worker_host,
            self.worker.2,
            self.ray_address,
            self.join_limit.as_secs(),
            self.worker_host,
            self.ray_address
        )
    }

    /// Runs `vllm serve …` in the head container and pumps its output; its end is the
    /// target's exit.
    async fn start_server(&self, tx: mpsc::Sender<SourceMsg>) -> Result<()> {
        let (docker, id) = (self.head.0.clone(), self.head.1.clone());
        let exec = docker
            .create_exec(
                &id,
                CreateExecOptions {
                    cmd: Some(self.serve_argv.clone()),
                    env: Some(self.serve_env.clone()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await
            .context("creating the exec of vllm serve")?;
        let started = docker
            .start_exec(&exec.id, None)
            .await
            .context("starting vllm serve")?;
        let StartExecResults::Attached { mut output, .. } = started else {
            bail!("Docker started vllm serve detached; its output cannot be followed");
        };
        let exec_id = exec.id.clone();
        tokio::spawn(async move {
            let mut out = LineSplitter::default();
            let mut err = LineSplitter::default();
            while let Some(item) = output.next().await {
                let (which, splitter, bytes) = match item {
                    Ok(bollard::container::LogOutput::StdErr { message }) => {
                        (LogStream::Stderr, &mut err, message)
                    }
                    Ok(bollard::container::LogOutput::StdOut { message })
                    | Ok(bollard::container::LogOutput::Console { message }) => {
                        (LogStream::Stdout, &mut out, message)
                    }
                    Ok(bollard::container::LogOutput::StdIn { .. }) => continue,
                    Err(_) => break,
                };
                for line in splitter.feed(&bytes) {
                    if tx.send(SourceMsg::Line(which, line)).await.is_err() {
                        return;
                    }
                }
            }
            for (which, s) in [(LogStream::Stdout, &mut out), (LogStream::Stderr, &mut err)] {
                if let Some(line) = s.finish() {
                    let _ = tx.send(SourceMsg::Line(which, line)).await;
                }
            }
            let code = docker
                .inspect_exec(&exec_id)
                .await
                .ok()
                .and_then(|i| i.exit_code);
            let _ = tx
                .send(SourceMsg::Exited(ExitInfo {
                    code,
                    detail: Some("vllm serve in the Ray head container ended".into()),
                    ..ExitInfo::default()
                }))
                .await;
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosts::NcclInterfaces;

    fn spec(head: &str, worker: &str) -> ClusterSpec {
        ClusterSpec {
            head: head.into(),
            worker: worker.into(),
            parallel: "tensor".into(),
            ray_port: 6379,
            join_limit_s: 600,
            transport: "rdma".into(),
            nccl_env: BTreeMap::from([("NCCL_IB_HCA".to_string(), "rocep1s0f1".to_string())]),
            local_ip: None,
        }
    }

    fn host(name: &str, ip: Option<&str>) -> Host {
        Host {
            name: name.into(),
            ssh: format!("me@{name}"),
            ssh_config: None,
            docker_socket: crate::hosts::DEFAULT_DOCKER_SOCKET.into(),
            mxtune: "mxtune".into(),
            nccl: NcclInterfaces {
                socket_ifname: Some("enp1s0f1np1".into()),
                ib_hca: Some("mlx5_0".into()),
                host_ip: ip.map(String::from),
                ..Default::default()
            },
            defined_at: "hosts.toml:1".into(),
        }
    }

    #[test]
    fn two_images_under_one_tag_name_both_hosts_and_ids_and_the_copy_to_run() {
        let lookup = |n: &str| match n {
            "spark1" => Ok(host("spark1", Some("192.168.200.11"))),
            _ => Ok(host(n, Some("192.168.200.12"))),
        };
        let p = ClusterPlan::resolve(&spec("spark1", "spark2"), lookup).unwrap();
        let head = format!("sha256:4c1b0a9d2e3f{}", "0".repeat(52));
        let m = image_mismatch(&p, "vllm:v1", &head, "9e8d7c6b5a43");
        assert_eq!(
            m,
            "image vllm:v1 is not the same image on both hosts: on host spark1 (the head) it is 4c1b0a9d2e3f, on host spark2 (the worker) 9e8d7c6b5a43; both nodes must run the same image (one build of vLLM, Ray and NCCL): copy the head's to the worker's host with `ssh me@spark1 docker save vllm:v1 | ssh me@spark2 docker load`, or build both from the same source and tag"
        );
        // The head here, the worker's engine on another socket, reached with its ssh -F file.
        let mut local = spec("local", "spark2");
        local.local_ip = Some("192.168.200.11".into());
        let mut p = ClusterPlan::resolve(&local, lookup).unwrap();
        if let Some(h) = p.worker.host.as_mut() {
            h.docker_socket = "/run/user/1000/docker.sock".into();
            h.ssh_config = Some("/home/me/.ssh/sparks".into());
        }
        let m = image_mismatch(&p, "vllm:v1", &head, "9e8d7c6b5a43");
        assert!(
            m.contains("`docker save vllm:v1 | ssh -F /home/me/.ssh/sparks me@spark2 docker -H unix:///run/user/1000/docker.sock load`"),
            "{m}"
        );
    }

    #[test]
    fn plan_takes_addresses_and_environment_from_hosts_and_preset() {
        let lookup = |n: &str| match n {
            "spark1" => Ok(host("spark1", Some("192.168.200.11"))),
            "spark2" => Ok(host("spark2", Some("192.168.200.12"))),
            "noip" => Ok(host("noip", None)),
            _ => bail!("no host named {n:?}"),
        };
        let p = ClusterPlan::resolve(&spec("spark1", "spark2"), lookup).unwrap();
        assert_eq!(p.ray_address(), "192.168.200.11:6379");
        assert_eq!(p.worker.env["VLLM_HOST_IP"], "192.168.200.12");
        assert_eq!(p.worker.env["NCCL_SOCKET_IFNAME"], "enp1s0f1np1");
        // The preset's interfaces override the host's.
        assert_eq!(p.worker.env["NCCL_IB_HCA"], "rocep1s0f1");
        assert_eq!(p.engines().len(), 2);
        assert_eq!(
            ray_argv(&p, Role::Worker),
            [
                "ray",
                "start",
                "--address=192.168.200.11:6379",
                "--node-ip-address=192.168.200.12",
                "--block"
            ]
        );

        let local = ClusterPlan::resolve(&spec("local", "local"), lookup).unwrap();
        assert_eq!(local.ray_address(), "127.0.0.1:6379");
        assert_eq!(local.engines(), vec![None]);
        assert_eq!(
            ray_argv(&local, Role::Head),
            [
                "ray",
                "start",
                "--head",
                "--port=6379",
                "--node-ip-address=127.0.0.1",
                "--block"
            ]
        );

        let e = ClusterPlan::resolve(&spec("local", "spark2"), lookup)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cluster.local_ip is not set"), "{e}");
        let mut with_ip = spec("local", "spark2");
        with_ip.local_ip = Some("192.168.200.11".into());
        let p = ClusterPlan::resolve(&with_ip, lookup).unwrap();
        assert_eq!(p.head.env["VLLM_HOST_IP"], "192.168.200.11");
        let e = format!(
            "{:#}",
            ClusterPlan::resolve(&spec("spark1", "noip"), lookup).unwrap_err()
        );
        assert!(e.contains("host noip (hosts.toml:1) has no host_ip"), "{e}");
        let e = format!(
            "{:#}",
            ClusterPlan::resolve(&spec("spark1", "spark9"), lookup).unwrap_err()
        );
        assert!(e.contains("cluster.worker = \"spark9\""), "{e}");
    }

    fn found(run: &str, name: &str, role: Option<&str>, host: Option<&str>) -> Found {
        Found {
            id: format!("id-{name}"),
            name: name.into(),
            image: "img".into(),
            state: "running".into(),
            run_id: run.into(),
            preset: "tp2".into(),
            port: Some(8000),
            model: "m".into(),
            cluster_role: role.map(String::from),
            cluster_host: host.map(String::from),
        }
    }

    #[test]
    fn reattach_finds_both_nodes_by_label_or_says_which_is_missing_where() {
        let lookup = |n: &str| Ok(host(n, Some("192.168.200.12")));
        let mut with_ip = spec("local", "spark2");
        with_ip.local_ip = Some("192.168.200.11".into());
        let plan = ClusterPlan::resolve(&with_ip, lookup).unwrap();
        let head = found("R", "mxtune-R-head", Some("head"), Some("local"));
        let worker = found("R", "mxtune-R-worker", Some("worker"), Some("spark2"));
        // Another run's nodes, and a single container, on the same engines.
        let other = found("S", "mxtune-S-head", Some("head"), Some("local"));
        let single = found("C", "mxtune-C", None, None);
        let here = [other.clone(), head.clone(), single.clone()];
        let there = [worker.clone()];
        let (h, w) = find_nodes(&plan, "tp2", "R", &here, &there).unwrap();
        assert_eq!(
            (h.name.as_str(), w.name.as_str()),
            ("mxtune-R-head", "mxtune-R-worker")
        );
        // A node's container name finds its run.
        let (h, _) = find_nodes(&plan, "tp2", "mxtune-R-worker", &here, &there).unwrap();
        assert_eq!(h.name, "mxtune-R-head");
        let e = find_nodes(&plan, "tp2", "X", &here, &there)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("no container of run \"X\" on host local (the Ray head) or host spark2 (the Ray worker)"),
            "{e}"
        );
        let e = find_nodes(&plan, "tp2", "C", &here, &there)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("run C on host local is a single container (mxtune-C, preset tp2), not a two-node cluster: re-attach with `mxtune launch --preset tp2 --reattach C`"),
            "{e}"
        );
        let e = find_nodes(&plan, "tp2", "R", &here, &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("run R has its Ray head (container mxtune-R-head) on host local, but no Ray worker container on host spark2"),
            "{e}"
        );
        assert!(e.contains("`mxtune stop --cluster tp2 R`"), "{e}");
        let e = find_nodes(&plan, "tp2", "R", &[], &there)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("run R has its Ray worker (container mxtune-R-worker) on host spark2, but no Ray head container on host local"),
            "{e}"
        );
        // Nodes labelled for other hosts than the preset names: the preset is asked for.
        let moved = [found("R", "mxtune-R-head", Some("head"), Some("spark9"))];
        let e = find_nodes(&plan, "tp2", "R", &moved, &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("run R was not launched as the Ray head on host local and the Ray worker on host spark2 that preset tp2 names (its container mxtune-R-head is the head for host spark9)"),
            "{e}"
        );
    }

    #[test]
    fn reattach_reads_back_the_servers_lines_from_the_launchs_log() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("R.target.log"),
            "[head local] Ray runtime started.\n[mxtune] Ray cluster at 127.0.0.1:6379 has both nodes\nNCCL INFO Using network IB\n[worker spark2] Ray runtime started.\n",
        )
        .unwrap();
        let (lines, note) = read_earlier_server_lines(Some(dir.path()), "R");
        assert_eq!(
            lines,
            [
                "[mxtune] Ray cluster at 127.0.0.1:6379 has both nodes",
                "NCCL INFO Using network IB"
            ]
        );
        assert_eq!(note, None);
        let (lines, note) = read_earlier_server_lines(Some(dir.path()), "S");
        assert!(lines.is_empty());
        let note = note.unwrap();
        assert!(
            note.starts_with("the server's output before this re-attach is not here (")
                && note.contains("S.target.log"),
            "{note}"
        );
    }

    #[test]
    fn ray_status_counts_active_nodes_and_total_gpus() {
        let two = "======== Autoscaler status: 2025-11-26 10:00:00.000000 ========
Node status
---------------------------------------------------------------
Active:
 1 node_5d1c0a
 1 node_9e0b3f
Pending:
 (no pending nodes)
Recent failures:
 (no failures)

Resources
---------------------------------------------------------------
Usage:
 0.0/40.0 CPU
 0.0/2.0 GPU
 0B/200.00GiB memory

Demands:
 (no resource demands)
";
        assert_eq!(
            parse_ray_status(two),
            RayStatus {
                nodes: 2,
                gpus: 2.0
            }
        );
        let old = "Healthy:\n 1 ray.head.default\nPending:\n (no pending nodes)\nResources\n Total Usage:\n 1.0/1.0 GPU\n";
        assert_eq!(
            parse_ray_status(old),
            RayStatus {
                nodes: 1,
                gpus: 1.0
            }
        );
        assert_eq!(parse_ray_status(""), RayStatus::default());
    }
}
