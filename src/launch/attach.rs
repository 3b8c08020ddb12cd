//! The attach target: an endpoint that is already running. mxtune checks readiness and
//! benchmarks it, but never stops it.

use super::LaunchEvent;
use super::follow::{Launch, LaunchOptions};
use super::ready::ReadyProbe;
use super::target::{Target, TargetFacts};
use anyhow::{Result, bail};
use tokio::sync::mpsc;

/// An endpoint somebody else runs.
#[derive(Debug, Clone)]
pub struct AttachTarget {
    /// Base URL, e.g. `http://spark:8000`.
    pub url: String,
}

impl AttachTarget {
    /// Follows `url` (no logs: kernel-path checks come out `unknown`); `model` empty accepts
    /// whichever model the server lists.
    pub fn attach(
        url: &str,
        model: &str,
        opts: &LaunchOptions,
        events: mpsc::UnboundedSender<LaunchEvent>,
    ) -> Result<Launch> {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            bail!("attach URL {url:?} must start with http:// or https://");
        }
        let url = url.trim_end_matches('/').to_string();
        let probe = ReadyProbe::new(&url, model, opts.api_key.clone(), opts.probe_timeout)?;
        // No log source: the sender is dropped at once and the follower only probes.
        let (_, rx) = mpsc::channel(1);
        Launch::follow(
            Target::Attach(AttachTarget { url }),
            rx,
            probe,
            &[],
            opts,
            events,
        )
    }

    /// Does nothing: mxtune did not start this endpoint.
    pub fn stop(&self) -> String {
        format!(
            "attached to {}: mxtune did not start it, so it leaves it running",
            self.url
        )
    }

    /// Facts: only the URL is known.
    pub fn facts(&self) -> TargetFacts {
        TargetFacts {
            kind: "attach".into(),
            name: self.url.clone(),
            url: self.url.clone(),
            notes: vec!["attached endpoint: no image, process or logs known to mxtune".into()],
            ..Default::default()
        }
    }
}
