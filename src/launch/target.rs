//! The [`Target`] every launcher shares: Docker container, engine child process, attached URL.

use super::attach::AttachTarget;
use super::cluster::ClusterTarget;
use super::docker::DockerTarget;
use super::engine::EngineTarget;
use crate::vocab::TargetKind;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A launched (or attached) target.
#[derive(Debug)]
pub enum Target {
    /// A container on a Docker engine.
    Docker(DockerTarget),
    /// `mxtune serve` (or another engine binary) as a child process.
    Engine(EngineTarget),
    /// An endpoint somebody else runs.
    Attach(AttachTarget),
    /// vLLM over Ray: a head and a worker container on two hosts.
    Cluster(Box<ClusterTarget>),
}

/// A mounted source tree and its git commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceTree {
    /// Path inside the target.
    pub path: String,
    /// `git rev-parse HEAD` there.
    pub git_sha: String,
}

/// What the run record needs to know about the target.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TargetFacts {
    /// `docker`, `engine` or `attach`.
    pub kind: String,
    /// Container name, engine pid, or URL.
    pub name: String,
    /// Base URL of the API.
    pub url: String,
    /// Docker container id.
    pub container_id: Option<String>,
    /// Image reference as launched.
    pub image: Option<String>,
    /// Image id (`sha256:…`).
    pub image_id: Option<String>,
    /// Registry digests of the image.
    pub image_digests: Vec<String>,
    /// Engine process id.
    pub pid: Option<u32>,
    /// Engine program path.
    pub program: Option<String>,
    /// `pip freeze` inside the container.
    pub pip_freeze: Option<String>,
    /// Mounted source trees with their git SHAs.
    pub source_trees: Vec<SourceTree>,
    /// `nvidia-smi` output inside the container.
    pub nvidia_smi: Option<String>,
    /// Facts that could not be collected, and why.
    pub notes: Vec<String>,
    /// Each node of a two-node cluster (head first); empty for other targets.
    pub nodes: Vec<NodeFacts>,
}

pub use crate::record::schema::NodeFacts;

impl Target {
    /// Which kind of target this is.
    pub fn kind(&self) -> TargetKind {
        match self {
            Target::Docker(_) => TargetKind::Docker,
            Target::Engine(_) => TargetKind::Engine,
            Target::Attach(_) => TargetKind::Attach,
            Target::Cluster(_) => TargetKind::DockerCluster,
        }
    }

    /// Base URL of the OpenAI API.
    pub fn url(&self) -> &str {
        match self {
            Target::Docker(t) => &t.url,
            Target::Engine(t) => &t.url,
            Target::Attach(t) => &t.url,
            Target::Cluster(t) => &t.url,
        }
    }

    /// A short description for messages, e.g. `container mxtune-01J…`.
    pub fn describe(&self) -> String {
        match self {
            Target::Docker(t) => format!("container {}", t.name),
            Target::Engine(t) => format!("engine process {} ({})", t.pid, t.program.display()),
            Target::Attach(t) => format!("endpoint {}", t.url),
            Target::Cluster(t) => t.describe(),
        }
    }

    /// Stops the target: SIGTERM, `grace`, kill; a container is removed unless `keep`.
    /// Attached endpoints are not ours: stop does nothing and says so.
    pub async fn stop(&mut self, grace: Duration, keep: bool) -> Result<String> {
        match self {
            Target::Docker(t) => t.stop(grace, keep).await,
            Target::Engine(t) => t.stop(grace).await,
            Target::Attach(t) => Ok(t.stop()),
            Target::Cluster(t) => t.stop(grace, keep).await,
        }
    }

    /// Facts for the run record.
    pub async fn facts(&self) -> TargetFacts {
        match self {
            Target::Docker(t) => t.facts().await,
            Target::Engine(t) => t.facts(),
            Target::Attach(t) => t.facts(),
            Target::Cluster(t) => t.facts().await,
        }
    }
}
