//! The Docker target: a vLLM container created through the Docker Engine API (bollard),
//! from a [`LaunchSpec`] and its [`ContainerSpec`].

use super::follow::{Launch, LaunchOptions, SourceMsg};
use super::logbuf::LineSplitter;
use super::ready::ReadyProbe;
use super::target::{SourceTree, Target, TargetFacts};
use super::{ExitInfo, LaunchEvent, LogStream};
use crate::vocab::{ContainerSpec, LaunchSpec, NetworkMode};
use anyhow::{Context, Result, anyhow, bail};
use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::{
    ContainerCreateBody, DeviceMapping, DeviceRequest, HostConfig, PortBinding, ResourcesUlimits,
};
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, ListContainersOptions, LogsOptions,
    RemoveContainerOptions, StopContainerOptions, UploadToContainerOptions,
};
use futures::StreamExt;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::mpsc;

/// Label holding the run id; every container mxtune creates has it.
pub const LABEL_RUN_ID: &str = "mxtune.run_id";
/// Label holding the preset name.
pub const LABEL_PRESET: &str = "mxtune.preset";
/// Label holding the mxtune version that created the container.
pub const LABEL_VERSION: &str = "mxtune.version";
/// Label holding the API port, so a re-attach needs no spec.
pub const LABEL_PORT: &str = "mxtune.port";
/// Label holding the served model name, so a re-attach needs no spec.
pub const LABEL_MODEL: &str = "mxtune.served_model";
/// Label of the short-lived container that asks an image for its vLLM version.
pub const LABEL_PROBE: &str = "mxtune.probe";

/// Where the Docker engine is, for messages.
pub fn docker_host() -> String {
    std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".to_string())
}

/// Connects to the engine named by `DOCKER_HOST` (unix socket or tcp; default the local
/// socket) and negotiates the API version, so older engines work.
pub async fn connect() -> Result<Docker> {
    let host = docker_host();
    let docker = Docker::connect_with_defaults().with_context(|| {
        format!("cannot use DOCKER_HOST={host}: mxtune speaks unix:// and tcp:// (for a remote machine, forward its socket over ssh; see docs/launching.md)")
    })?;
    docker.negotiate_version().await.with_context(|| {
        format!("cannot reach the Docker engine at {host}: is dockerd running, and may this user use it (docker group)?")
    })
}

/// Connects to a remote host's Docker engine through an SSH tunnel's local socket
/// (`remote_socket` is the engine's socket on that host, for messages).
pub async fn connect_tunnel(
    tunnel: &crate::hosts::ssh::Tunnel,
    remote_socket: &str,
) -> Result<Docker> {
    let local = tunnel.docker_socket.display().to_string();
    let docker = Docker::connect_with_unix(&local, 120, bollard::API_DEFAULT_VERSION)
        .with_context(|| format!("cannot use the forwarded socket {local}"))?;
    docker.negotiate_version().await.with_context(|| {
        let said = tunnel.ssh_said();
        format!(
            "cannot reach the Docker engine of host {} at unix://{remote_socket} through SSH: is dockerd running there, may the SSH user use it (docker group), and does its sshd allow forwarding (AllowStreamLocalForwarding)? (set docker = \"unix:///PATH\" in hosts.toml for another socket){}",
            tunnel.host,
            if said.is_empty() {
                String::new()
            } else {
                format!("; ssh said: {said}")
            }
        )
    })
}

/// The Docker engine to use: this machine's (`DOCKER_HOST`), or a remote host's through an
/// SSH tunnel that also forwards `port` (address and port as seen there). The tunnel must
/// outlive every use of the connection.
pub async fn connect_on(
    host: Option<&crate::hosts::Host>,
    port: Option<(&str, u16)>,
) -> Result<(Docker, Option<crate::hosts::ssh::Tunnel>)> {
    match host {
        None => Ok((connect().await?, None)),
        Some(h) => {
            let tunnel = crate::hosts::ssh::Tunnel::open(h, port).await?;
            let d = connect_tunnel(&tunnel, &h.docker_socket).await?;
            Ok((d, Some(tunnel)))
        }
    }
}

fn is_not_found(e: &DockerError) -> bool {
    matches!(
        e,
        DockerError::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// The container name mxtune uses when the spec gives none.
pub fn default_name(run_id: &str) -> String {
    let clean: String = run_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("mxtune-{clean}")
}

/// Host to connect to for a server that listens on `host` (wildcards mean loopback).
pub fn connect_host(host: &str) -> &str {
    match host {
        "" | "0.0.0.0" | "::" | "[::]" => "127.0.0.1",
        h => h,
    }
}

/// The create-container request for a spec: argv as entrypoint + cmd (never a shell
/// string), env, GPUs, ipc/shm, ulimits, devices, capabilities, network, mounts, labels.
pub fn container_body(
    spec: &LaunchSpec,
    c: &ContainerSpec,
    opts: &LaunchOptions,
) -> Result<ContainerCreateBody> {
    let Some((program, args)) = spec.argv.split_first() else {
        bail!(
            "the launch spec has an empty argv: nothing to run in image {}",
            c.image
        );
    };
    if c.image.is_empty() {
        bail!("the launch spec has no container image");
    }
    let mut labels: HashMap<String, String> = c.labels.clone().into_iter().collect();
    labels.insert(LABEL_RUN_ID.into(), opts.run_id.clone());
    labels.insert(LABEL_PRESET.into(), opts.preset.clone());
    labels.insert(LABEL_VERSION.into(), env!("CARGO_PKG_VERSION").into());
    labels.insert(LABEL_PORT.into(), spec.port.to_string());
    labels.insert(LABEL_MODEL.into(), spec.served_model_name.clone());
    let port_key = format!("{}/tcp", spec.port);
    let (network_mode, exposed_ports, port_bindings) = match c.network {
        NetworkMode::Host => ("host".to_string(), None, None),
        NetworkMode::Bridge => {
            let binding = PortBinding {
                host_ip: Some("127.0.0.1".into()),
                host_port: Some(spec.port.to_string()),
            };
            let map = HashMap::from([(port_key.clone(), Some(vec![binding]))]);
            ("bridge".to_string(), Some(vec![port_key]), Some(map))
        }
    };
    let ulimits = c
        .ulimits
        .iter()
        .map(|(name, (soft, hard))| ResourcesUlimits {
            name: Some(name.clone()),
            soft: Some(*soft),
            hard: Some(*hard),
        })
        .collect::<Vec<_>>();
    let devices = c
        .devices
        .iter()
        .map(|d| DeviceMapping {
            path_on_host: Some(d.clone()),
            path_in_container: Some(d.clone()),
            cgroup_permissions: Some("rwm".into()),
        })
        .collect::<Vec<_>>();
    let binds = c
        .mounts
        .iter()
        .map(|m| {
            format!(
                "{}:{}{}",
                m.host,
                m.container,
                if m.read_only { ":ro" } else { "" }
            )
        })
        .collect::<Vec<_>>();
    // Exactly what `docker run --gpus all` sends.
    let device_requests = c.gpus_all.then(|| {
        vec![DeviceRequest {
            driver: Some(String::new()),
            count: Some(-1),
            capabilities: Some(vec![vec!["gpu".to_string()]]),
            ..Default::default()
        }]
    });
    let host_config = HostConfig {
        network_mode: Some(network_mode),
        port_bindings,
        ipc_mode: c.ipc_host.then(|| "host".to_string()),
        shm_size: if c.ipc_host {
            None
        } else {
            c.shm_size.map(|s| s as i64)
        },
        ulimits: (!ulimits.is_empty()).then_some(ulimits),
        devices: (!devices.is_empty()).then_some(devices),
        cap_add: (!c.cap_add.is_empty()).then(|| c.cap_add.clone()),
        binds: (!binds.is_empty()).then_some(binds),
        device_requests,
        ..Default::default()
    };
    Ok(ContainerCreateBody {
        image: Some(c.image.clone()),
        entrypoint: Some(vec![program.clone()]),
        cmd: Some(args.to_vec()),
        env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        labels: Some(labels),
        exposed_ports,
        host_config: Some(host_config),
        ..Default::default()
    })
}

/// A tar archive of the files to place into the container (paths relative to `/`, with
/// their parent directories, so they land even in an image without them).
pub fn files_tar(files: &std::collections::BTreeMap<String, String>) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut dirs = std::collections::BTreeSet::new();
    for path in files.keys() {
        let rel = path.trim_start_matches('/');
        if rel.is_empty() || rel.split('/').any(|p| p == "..") {
            bail!("file path {path:?} in the container spec is not a plain absolute path");
        }
        let parts: Vec<&str> = rel.split('/').collect();
        for i in 1..parts.len() {
            dirs.insert(parts[..i].join("/"));
        }
    }
    for dir in &dirs {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        builder
            .append_data(&mut h, format!("{dir}/"), std::io::empty())
            .with_context(|| format!("cannot archive directory {dir}"))?;
    }
    for (path, contents) in files {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(contents.len() as u64);
        builder
            .append_data(&mut h, path.trim_start_matches('/'), contents.as_bytes())
            .with_context(|| format!("cannot archive file {path}"))?;
    }
    builder
        .into_inner()
        .context("cannot finish the files archive")
}

/// Makes sure the image is present: pulls it when allowed (progress as events), else says
/// how to get it.
pub async fn ensure_image(
    docker: &Docker,
    image: &str,
    allow_pull: bool,
    events: &mpsc::UnboundedSender<LaunchEvent>,
) -> Result<()> {
    match docker.inspect_image(image).await {
        Ok(_) => return Ok(()),
        Err(e) if is_not_found(&e) => {}
        Err(e) => {
            return Err(
                anyhow!(e).context(format!("cannot inspect image {image} on {}", docker_host()))
            );
        }
    }
    if !allow_pull {
        bail!(
            "image {image} is not present on the Docker engine at {}: pull it (`docker pull {image}` or mxtune's --pull), or build/load it there (`docker build -t {image} …`, `docker load`)",
            docker_host()
        );
    }
    let opts = CreateImageOptions {
        from_image: Some(image.to_string()),
        ..Default::default()
    };
    let _ = events.send(LaunchEvent::Phase {
        phase: super::Phase::Pulling,
    });
    let mut stream = docker.create_image(Some(opts), None, None);
    while let Some(item) = stream.next().await {
        let info = item.with_context(|| format!("pulling image {image} failed; check the name and the registry login (`docker login`)"))?;
        let status = [info.id, info.status]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" ");
        if !status.is_empty() {
            let _ = events.send(LaunchEvent::PullProgress { status });
        }
    }
    docker
        .inspect_image(image)
        .await
        .with_context(|| format!("image {image} still missing after the pull"))?;
    Ok(())
}

/// A container mxtune started (found by its labels).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Container id.
    pub id: String,
    /// Container name (without the leading `/`).
    pub name: String,
    /// Image reference.
    pub image: String,
    /// `running`, `exited`, …
    pub state: String,
    /// Run id label.
    pub run_id: String,
    /// Preset label.
    pub preset: String,
    /// API port label.
    pub port: Option<u16>,
    /// Served model label.
    pub model: String,
    /// `head` or `worker` for a node of a two-node cluster (label `mxtune.cluster.role`).
    pub cluster_role: Option<String>,
    /// The host a cluster node was started for (label `mxtune.cluster.host`).
    pub cluster_host: Option<String>,
}

/// Every container carrying mxtune's run-id label, running or not. Containers without the
/// label are never listed, so mxtune never touches them.
pub async fn find_mxtune_containers(docker: &Docker) -> Result<Vec<Found>> {
    let filters = HashMap::from([("label".to_string(), vec![LABEL_RUN_ID.to_string()])]);
    let opts = ListContainersOptions {
        all: true,
        filters: Some(filters),
        ..Default::default()
    };
    let list = docker
        .list_containers(Some(opts))
        .await
        .with_context(|| format!("cannot list containers on {}", docker_host()))?;
    Ok(list
        .into_iter()
        .filter_map(|c| {
            let labels = c.labels.unwrap_or_default();
            let run_id = labels.get(LABEL_RUN_ID)?.clone();
            Some(Found {
                id: c.id.unwrap_or_default(),
                name: c
                    .names
                    .and_then(|n| n.first().cloned())
                    .unwrap_or_default()
                    .trim_start_matches('/')
                    .to_string(),
                image: c.image.unwrap_or_default(),
                state: c.state.map(|s| s.to_string()).unwrap_or_default(),
                run_id,
                preset: labels.get(LABEL_PRESET).cloned().unwrap_or_default(),
                port: labels.get(LABEL_PORT).and_then(|p| p.parse().ok()),
                model: labels.get(LABEL_MODEL).cloned().unwrap_or_default(),
                cluster_role: labels.get(super::cluster::LABEL_ROLE).cloned(),
                cluster_host: labels.get(super::cluster::LABEL_HOST).cloned(),
            })
        })
        .collect())
}

/// A container mxtune created (or re-attached to).
#[derive(Debug, Clone)]
pub struct DockerTarget {
    pub(crate) docker: Docker,
    /// Container id.
    pub id: String,
    /// Container name.
    pub name: String,
    /// Image reference.
    pub image: String,
    /// Base URL of the API.
    pub url: String,
    mounts: Vec<String>,
}

/// The container settings of `spec`, which `target` (e.g. "the Docker target") needs; an
/// error saying so when the spec has none.
pub(crate) fn container_section<'a>(
    spec: &'a LaunchSpec,
    target: &str,
) -> Result<&'a ContainerSpec> {
    spec.container.as_ref().with_context(|| {
        format!("the launch spec has no container section; {target} needs one (image, network, …)")
    })
}

impl DockerTarget {
    /// Pulls if needed and allowed, creates the container, places the files, starts it and
    /// follows it.
    pub async fn launch(
        docker: Docker,
        spec: &LaunchSpec,
        opts: &LaunchOptions,
        events: mpsc::UnboundedSender<LaunchEvent>,
    ) -> Result<Launch> {
        let c = container_section(spec, "the Docker target")?;
        let name = c.name.clone().unwrap_or_else(|| default_name(&opts.run_id));
        let target = Self::create_started(docker, spec, opts, &name, &[], &events).await?;
        let (tx, rx) = mpsc::channel(1024);
        target.follow(tx, rx, spec, opts, events)
    }

    /// Pulls if needed and allowed, creates the container `name` (with `labels` beside
    /// mxtune's own), places the files and starts it; a container that cannot start is
    /// removed unless `opts.keep`.
    pub(crate) async fn create_started(
        docker: Docker,
        spec: &LaunchSpec,
        opts: &LaunchOptions,
        name: &str,
        labels: &[(&str, &str)],
        events: &mpsc::UnboundedSender<LaunchEvent>,
    ) -> Result<DockerTarget> {
        let c = container_section(spec, "the Docker target")?;
        let mut body = container_body(spec, c, opts)?;
        if let Some(l) = body.labels.as_mut() {
            l.extend(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        }
        ensure_image(&docker, &c.image, opts.allow_pull, events).await?;
        if opts.remote_host.is_none() && docker_host().starts_with("unix://") {
            super::preflight::create_writable_mounts(&c.mounts)?;
        }
        let name = name.to_string();
        let create = CreateContainerOptions {
            name: Some(name.clone()),
            ..Default::default()
        };
        let created = docker.create_container(Some(create), body).await.map_err(|e| match e {
            DockerError::DockerResponseServerError { status_code: 409, .. } => anyhow!(e).context(format!(
                "a container named {name} already exists: stop it (`mxtune stop {name}`) or choose another name"
            )),
            e => anyhow!(e).context(format!("cannot create container {name} from image {}", c.image)),
        })?;
        let target = DockerTarget {
            docker: docker.clone(),
            id: created.id.clone(),
            name: name.clone(),
            image: c.image.clone(),
            url: opts
                .api_url
                .clone()
                .unwrap_or_else(|| format!("http://{}:{}", connect_host(&spec.host), spec.port)),
            mounts: c.mounts.iter().map(|m| m.container.clone()).collect(),
        };
        let started = async {
            if !c.files.is_empty() {
                let tar = files_tar(&c.files)?;
                let up = UploadToContainerOptions {
                    path: "/".into(),
                    ..Default::default()
                };
                docker
                    .upload_to_container(&created.id, Some(up), bollard::body_full(tar.into()))
                    .await
                    .with_context(|| format!("cannot place files into container {name}"))?;
            }
            docker
                .start_container(&created.id, None)
                .await
                .with_context(|| {
                    format!(
                        "cannot start container {name} (image {}, port {})",
                        c.image, spec.port
                    )
                })
        }
        .await;
        if let Err(e) = started {
            // Leave nothing half-made behind unless the operator wants to look at it.
            if !opts.keep {
                let _ = target.remove().await;
            }
            return Err(e);
        }
        Ok(target)
    }

    /// Re-attaches to a container mxtune started earlier (after mxtune restarted). A spec
    /// without a port (none given) takes port and model from the container's labels.
    pub async fn reattach(
        docker: Docker,
        found: &Found,
        spec: &LaunchSpec,
        opts: &LaunchOptions,
        events: mpsc::UnboundedSender<LaunchEvent>,
    ) -> Result<Launch> {
        let info = docker
            .inspect_container(&found.id, None)
            .await
            .with_context(|| format!("cannot inspect container {}", found.name))?;
        let labels = info
            .config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default();
        if !labels.contains_key(LABEL_RUN_ID) {
            bail!(
                "container {} has no {LABEL_RUN_ID} label: mxtune did not start it and will not touch it",
                found.name
            );
        }
        let mounts = info
            .mounts
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| m.destination)
            .collect();
        let mut spec = spec.clone();
        if spec.port == 0 {
            spec.port = found.port.with_context(|| {
                format!("container {} has no {LABEL_PORT} label: give the preset or spec it was launched with", found.name)
            })?;
            spec.served_model_name = found.model.clone();
        }
        let spec = &spec;
        let target = DockerTarget {
            docker,
            id: found.id.clone(),
            name: found.name.clone(),
            image: found.image.clone(),
            url: opts
                .api_url
                .clone()
                .unwrap_or_else(|| format!("http://{}:{}", connect_host(&spec.host), spec.port)),
            mounts,
        };
        let (tx, rx) = mpsc::channel(1024);
        target.follow(tx, rx, spec, opts, events)
    }

    /// The target for a container found by its labels (a cluster node being re-attached),
    /// its API at `url`.
    pub(crate) async fn from_found(docker: Docker, found: &Found, url: String) -> Result<Self> {
        let info = docker
            .inspect_container(&found.id, None)
            .await
            .with_context(|| format!("cannot inspect container {}", found.name))?;
        let mounts = info
            .mounts
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| m.destination)
            .collect();
        Ok(DockerTarget {
            docker,
            id: found.id.clone(),
            name: found.name.clone(),
            image: found.image.clone(),
            url,
            mounts,
        })
    }

    fn follow(
        self,
        tx: mpsc::Sender<SourceMsg>,
        rx: mpsc::Receiver<SourceMsg>,
        spec: &LaunchSpec,
        opts: &LaunchOptions,
        events: mpsc::UnboundedSender<LaunchEvent>,
    ) -> Result<Launch> {
        tokio::spawn(pump_logs(self.docker.clone(), self.id.clone(), tx));
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
        Launch::follow(Target::Docker(self), rx, probe, &spec.checks, &opts, events)
    }

    pub(crate) async fn remove(&self) -> Result<()> {
        let opts = RemoveContainerOptions {
            force: true,
            ..Default::default()
        };
        match self.docker.remove_container(&self.id, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(anyhow!(e).context(format!("cannot remove container {}", self.name))),
        }
    }

    /// SIGTERM, `grace`, kill (Docker's stop does exactly this), then remove unless `keep`.
    pub async fn stop(&self, grace: Duration, keep: bool) -> Result<String> {
        stop_container(&self.docker, &self.id, &self.name, grace, keep).await
    }

    /// Image id/digest, `pip freeze`, git SHAs of mounted trees, `nvidia-smi`.
    pub async fn facts(&self) -> TargetFacts {
        let mut facts = TargetFacts {
            kind: "docker".into(),
            name: self.name.clone(),
            url: self.url.clone(),
            container_id: Some(self.id.clone()),
            image: Some(self.image.clone()),
            ..Default::default()
        };
        match self.docker.inspect_image(&self.image).await {
            Ok(img) => {
                facts.image_id = img.id;
                facts.image_digests = img.repo_digests.unwrap_or_default();
            }
            Err(e) => facts
                .notes
                .push(format!("image {} could not be inspected: {e}", self.image)),
        }
        match exec_output(&self.docker, &self.id, &["pip", "freeze"]).await {
            Ok(out) => facts.pip_freeze = Some(out),
            Err(first) => {
                match exec_output(&self.docker, &self.id, &["python3", "-m", "pip", "freeze"]).await
                {
                    Ok(out) => facts.pip_freeze = Some(out),
                    Err(e) => facts
                        .notes
                        .push(format!("pip freeze unavailable: {first:#}; {e:#}")),
                }
            }
        }
        for m in &self.mounts {
            if let Ok(sha) = exec_output(
                &self.docker,
                &self.id,
                &["git", "-C", m, "rev-parse", "HEAD"],
            )
            .await
            {
                facts.source_trees.push(SourceTree {
                    path: m.clone(),
                    git_sha: sha.trim().to_string(),
                });
            }
        }
        match exec_output(&self.docker, &self.id, &["nvidia-smi"]).await {
            Ok(out) => facts.nvidia_smi = Some(out),
            Err(e) => facts
                .notes
                .push(format!("nvidia-smi unavailable in the container: {e:#}")),
        }
        facts
    }
}

/// Stops and (unless `keep`) removes a container by id, refusing ones without mxtune's label.
pub async fn stop_container(
    docker: &Docker,
    id: &str,
    name: &str,
    grace: Duration,
    keep: bool,
) -> Result<String> {
    let info = match docker.inspect_container(id, None).await {
        Ok(i) => i,
        Err(e) if is_not_found(&e) => return Ok(format!("container {name} is already gone")),
        Err(e) => return Err(anyhow!(e).context(format!("cannot inspect container {name}"))),
    };
    let labels = info
        .config
        .as_ref()
        .and_then(|c| c.labels.clone())
        .unwrap_or_default();
    if !labels.contains_key(LABEL_RUN_ID) {
        bail!(
            "container {name} has no {LABEL_RUN_ID} label: mxtune did not start it and will not touch it"
        );
    }
    let running = info.state.as_ref().and_then(|s| s.running).unwrap_or(false);
    if running {
        let opts = StopContainerOptions {
            t: Some(grace.as_secs().min(i32::MAX as u64) as i32),
            ..Default::default()
        };
        match docker.stop_container(id, Some(opts)).await {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => return Ok(format!("container {name} is already gone")),
            Err(e) => return Err(anyhow!(e).context(format!("cannot stop container {name}"))),
        }
    }
    if keep {
        return Ok(format!("stopped container {name} (kept)"));
    }
    let opts = RemoveContainerOptions {
        force: true,
        ..Default::default()
    };
    match docker.remove_container(id, Some(opts)).await {
        Ok(()) => Ok(format!("stopped and removed container {name}")),
        Err(e) if is_not_found(&e) => Ok(format!("stopped container {name} (already removed)")),
        Err(e) => Err(anyhow!(e).context(format!("cannot remove container {name}"))),
    }
}

/// Asks `image` which vLLM it carries: `vllm --version` in a short-lived container of that
/// image (no GPU, no network, no mounts), removed afterwards whatever happened. Returns the last
/// line of the output that reads as a version, and fails with the output when none does, when
/// the command fails, or after `limit`.
pub async fn probe_vllm_version(docker: &Docker, image: &str, limit: Duration) -> Result<String> {
    let name = format!(
        "mxtune-probe-{}",
        ulid::Ulid::generate().to_string().to_lowercase()
    );
    let body = ContainerCreateBody {
        image: Some(image.to_string()),
        entrypoint: Some(vec!["vllm".into()]),
        cmd: Some(vec!["--version".into()]),
        labels: Some(HashMap::from([(
            LABEL_PROBE.to_string(),
            "vllm-version".to_string(),
        )])),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let create = CreateContainerOptions {
        name: Some(name.clone()),
        ..Default::default()
    };
    let created = docker
        .create_container(Some(create), body)
        .await
        .with_context(|| {
            format!("cannot create a container of image {image} to run `vllm --version`")
        })?;
    let answer = tokio::time::timeout(limit, run_to_end(docker, &created.id)).await;
    let removed = docker
        .remove_container(
            &created.id,
            Some(RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await;
    let (code, output) = match answer {
        Ok(r) => r.with_context(|| format!("`vllm --version` in image {image}"))?,
        Err(_) => bail!(
            "`vllm --version` in image {image} did not finish within {} s",
            limit.as_secs()
        ),
    };
    if let Err(e) = removed
        && !is_not_found(&e)
    {
        return Err(anyhow!(e).context(format!(
            "cannot remove the version-probe container {name}: remove it with `docker rm -f {name}`"
        )));
    }
    let found = output
        .lines()
        .rev()
        .find(|l| crate::flags::versions::VllmVersion::parse(l).is_some());
    match (code, found) {
        (0, Some(line)) => Ok(line.trim().to_string()),
        (c, _) => bail!(
            "`vllm --version` in image {image} exited with {c} and printed no version: {}",
            output.trim().chars().take(300).collect::<String>()
        ),
    }
}

/// Starts a created container, waits for its end, and returns its exit code and output.
async fn run_to_end(docker: &Docker, id: &str) -> Result<(i64, String)> {
    docker
        .start_container(id, None)
        .await
        .context("cannot start the container")?;
    let mut wait = docker.wait_container(id, None);
    let code = match wait.next().await {
        Some(Ok(r)) => r.status_code,
        // bollard reports a non-zero exit as this error; the code is what matters here.
        Some(Err(DockerError::DockerContainerWaitError { code, .. })) => code,
        Some(Err(e)) => return Err(anyhow!(e).context("waiting for the container")),
        None => bail!("the container's wait stream ended without an exit status"),
    };
    let opts = LogsOptions {
        stdout: true,
        stderr: true,
        ..Default::default()
    };
    let mut out = String::new();
    let mut logs = docker.logs(id, Some(opts));
    while let Some(chunk) = logs.next().await {
        let chunk = chunk.context("reading the container's output")?;
        out.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
    }
    Ok((code, out))
}

pub(crate) async fn exec_output(docker: &Docker, id: &str, cmd: &[&str]) -> Result<String> {
    let exec = docker
        .create_exec(
            id,
            CreateExecOptions {
                cmd: Some(cmd.iter().map(|s| s.to_string()).collect::<Vec<_>>()),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .with_context(|| format!("exec {cmd:?}"))?;
    let mut out = String::new();
    if let StartExecResults::Attached { mut output, .. } =
        docker
            .start_exec(&exec.id, None)
            .await
            .with_context(|| format!("exec {cmd:?}"))?
    {
        while let Some(chunk) = output.next().await {
            match chunk {
                Ok(c) => out.push_str(&String::from_utf8_lossy(&c.into_bytes())),
                Err(e) => return Err(anyhow!(e).context(format!("exec {cmd:?}: output stream"))),
            }
        }
    }
    let code = docker
        .inspect_exec(&exec.id)
        .await
        .with_context(|| format!("exec {cmd:?}"))?
        .exit_code;
    if code == Some(0) {
        Ok(out)
    } else {
        bail!(
            "exec {cmd:?} exited with {code:?}: {}",
            out.trim().chars().take(200).collect::<String>()
        )
    }
}

/// Streams the container's stdout/stderr line by line, then reports how it ended.
pub(crate) async fn pump_logs(docker: Docker, id: String, tx: mpsc::Sender<SourceMsg>) {
    let opts = LogsOptions {
        follow: true,
        stdout: true,
        stderr: true,
        ..Default::default()
    };
    let mut out = LineSplitter::default();
    let mut err = LineSplitter::default();
    let mut stream = docker.logs(&id, Some(opts));
    while let Some(item) = stream.next().await {
        let (which, splitter, bytes) = match item {
            Ok(bollard::container::LogOutput::StdErr { message }) => {
                (LogStream::Stderr, &mut err, message)
            }
            Ok(bollard::container::LogOutput::StdOut { message }) => {
                (LogStream::Stdout, &mut out, message)
            }
            Ok(bollard::container::LogOutput::Console { message }) => {
                (LogStream::Combined, &mut out, message)
            }
            Ok(bollard::container::LogOutput::StdIn { .. }) => continue,
            Err(e) => {
                let _ = tx
                    .send(SourceMsg::Event(LaunchEvent::Warning {
                        message: format!("log stream of container {id} broke: {e}"),
                    }))
                    .await;
                break;
            }
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
    let exit = exit_info(&docker, &id).await;
    let _ = tx.send(SourceMsg::Exited(exit)).await;
}

async fn exit_info(docker: &Docker, id: &str) -> ExitInfo {
    // The log stream can end a moment before the state says `exited`.
    for _ in 0..50 {
        match docker.inspect_container(id, None).await {
            Ok(info) => {
                let state = info.state.unwrap_or_default();
                if state.running == Some(true) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                return ExitInfo {
                    code: state.exit_code,
                    signal: None,
                    oom_killed: state.oom_killed.unwrap_or(false),
                    detail: state.error.filter(|e| !e.is_empty()),
                };
            }
            Err(e) if is_not_found(&e) => {
                return ExitInfo {
                    detail: Some("container removed".into()),
                    ..Default::default()
                };
            }
            Err(e) => {
                return ExitInfo {
                    detail: Some(format!("cannot inspect the container: {e}")),
                    ..Default::default()
                };
            }
        }
    }
    ExitInfo {
        detail: Some("log stream ended but the container still runs".into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::Mount;
    use std::collections::BTreeMap;

    fn spec() -> LaunchSpec {
        LaunchSpec {
            argv: ["vllm", "serve", "openai/gpt-oss-120b", "--port", "8000"]
                .map(String::from)
                .to_vec(),
            env: BTreeMap::from([("VLLM_MXFP4_BACKEND".to_string(), "marlin".to_string())]),
            host: "0.0.0.0".into(),
            port: 8000,
            container: Some(ContainerSpec {
                image: "vllm:fork".into(),
                network: NetworkMode::Host,
                ipc_host: true,
                shm_size: Some(1 << 30),
                ulimits: BTreeMap::from([
                    ("memlock".to_string(), (-1, -1)),
                    ("stack".to_string(), (67108864, 67108864)),
                ]),
                devices: vec!["/dev/infiniband".into()],
                cap_add: vec!["IPC_LOCK".into()],
                gpus_all: true,
                mounts: vec![Mount {
                    host: "/hf".into(),
                    container: "/root/.cache/huggingface".into(),
                    read_only: true,
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn body_maps_every_container_setting() {
        let s = spec();
        let opts = LaunchOptions::new("r1", "p1").unwrap();
        let b = container_body(&s, s.container.as_ref().unwrap(), &opts).unwrap();
        assert_eq!(b.entrypoint, Some(vec!["vllm".to_string()]));
        assert_eq!(b.cmd.as_deref().unwrap()[0], "serve");
        assert_eq!(b.env, Some(vec!["VLLM_MXFP4_BACKEND=marlin".to_string()]));
        let labels = b.labels.unwrap();
        assert_eq!(labels[LABEL_RUN_ID], "r1");
        assert_eq!(labels[LABEL_PRESET], "p1");
        let h = b.host_config.unwrap();
        assert_eq!(h.network_mode.as_deref(), Some("host"));
        assert!(h.port_bindings.is_none() && b.exposed_ports.is_none());
        assert_eq!(h.ipc_mode.as_deref(), Some("host"));
        assert_eq!(
            h.shm_size, None,
            "shm size is moot with the host IPC namespace"
        );
        let req = &h.device_requests.unwrap()[0];
        assert_eq!(req.count, Some(-1));
        assert_eq!(req.capabilities, Some(vec![vec!["gpu".to_string()]]));
        assert_eq!(h.ulimits.unwrap().len(), 2);
        assert_eq!(
            h.devices.unwrap()[0].path_in_container.as_deref(),
            Some("/dev/infiniband")
        );
        assert_eq!(h.cap_add, Some(vec!["IPC_LOCK".to_string()]));
        assert_eq!(
            h.binds,
            Some(vec!["/hf:/root/.cache/huggingface:ro".to_string()])
        );

        let mut empty = s.clone();
        empty.argv.clear();
        assert!(container_body(&empty, s.container.as_ref().unwrap(), &opts).is_err());
    }

    #[test]
    fn files_archive_has_parents_and_refuses_escapes() {
        let files = BTreeMap::from([("/tmp/a/b".to_string(), "x".to_string())]);
        let tar = files_tar(&files).unwrap();
        let mut ar = tar::Archive::new(tar.as_slice());
        let names: Vec<String> = ar
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, vec!["tmp/", "tmp/a/", "tmp/a/b"]);
        let bad = BTreeMap::from([("/tmp/../etc/x".to_string(), "x".to_string())]);
        assert!(files_tar(&bad).is_err());
        assert_eq!(default_name("01J/x y"), "mxtune-01J-x-y");
    }
}
