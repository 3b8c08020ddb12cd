//! Shared helpers for the launch tests: the test-server binary (built once with rustc, static)
//! and its `FROM scratch` image (built once per source hash), Docker availability, specs.
#![allow(dead_code)] // each test file uses a different subset

pub mod sshd;

use mxtune::vocab::{ContainerSpec, LaunchSpec, NetworkMode, PathCheck};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const SERVER_SOURCE: &str = include_str!("../docker/test_server.rs");

/// The test image: the server as its entrypoint, and as `vllm` and `ray` on the default PATH
/// so a rendered `vllm serve …` argv runs it too and it can play the Ray nodes of a cluster.
const DOCKERFILE: &str = "FROM scratch\nCOPY test-server /test-server\nCOPY test-server /usr/local/bin/vllm\nCOPY test-server /usr/local/bin/ray\nENTRYPOINT [\"/test-server\"]\n";

fn source_hash() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(&rustc)
        .arg("-V")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut h = Sha256::new();
    h.update(SERVER_SOURCE.as_bytes());
    h.update(version.as_bytes());
    h.update(DOCKERFILE.as_bytes());
    hex::encode(h.finalize())[..12].to_string()
}

/// The static test-server binary, compiled once per source/rustc version and cached in the
/// target dir.
pub fn server_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("test-server-{}", source_hash()));
        let bin = dir.join("test-server");
        if bin.exists() {
            return bin;
        }
        // Each process compiles in a directory of its own: rustc names its intermediate
        // object files after the crate, not the output, so two test processes building side
        // by side in one directory deleted each other's objects before the link.
        let work = dir.join(format!("build.{}", std::process::id()));
        std::fs::create_dir_all(&work).unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/docker/test_server.rs");
        let tmp = work.join("test-server");
        let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
        let out = std::process::Command::new(rustc)
            .args([
                "--edition",
                "2024",
                "-O",
                "-C",
                "target-feature=+crt-static",
                "-o",
            ])
            .arg(&tmp)
            .arg(&src)
            .output()
            .expect("run rustc for the test server");
        assert!(
            out.status.success(),
            "building the test server failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&tmp, &bin).unwrap();
        let _ = std::fs::remove_dir_all(&work);
        bin
    })
    .clone()
}

/// A TCP port free on every interface (bound then released), never the same one twice in
/// a test process, and below Linux's ephemeral range (32768–60999): a port the kernel hands
/// out for `:0` may also go to an outgoing connection (ssh, an HTTP probe) before the server
/// under test binds it, which once failed a Ray head in CI with "Address already in use".
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LO: u32 = 20000;
    const SPAN: u32 = 12000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Test binaries started one after another begin at different places.
    let start = std::process::id().wrapping_mul(7919) % SPAN;
    loop {
        let i = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(i < SPAN, "no free port left in {LO}..{}", LO + SPAN);
        let port = (LO + (start + i) % SPAN) as u16;
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
}

/// Docker, or `None` with a visible skip message; with `MXTUNE_TEST_DOCKER=require` a
/// missing engine fails the test instead.
pub async fn docker_or_skip(test: &str) -> Option<bollard::Docker> {
    match mxtune::launch::docker::connect().await {
        Ok(d) => Some(d),
        Err(e) => {
            if std::env::var("MXTUNE_TEST_DOCKER").as_deref() == Ok("require") {
                panic!("{test}: MXTUNE_TEST_DOCKER=require but no Docker engine: {e:#}");
            }
            eprintln!(
                "SKIPPED {test}: no Docker engine ({e:#}); set MXTUNE_TEST_DOCKER=require to make this a failure"
            );
            None
        }
    }
}

/// The test image `mxtune-test-server:<hash>` (`FROM scratch` + the static server), built
/// only when missing.
pub async fn test_image(docker: &bollard::Docker) -> String {
    test_image_with_env(docker, &[]).await
}

/// The test image with `ENV` lines baked in (e.g. the vLLM release the server plays, so that
/// `vllm --version` in a fresh container of it answers that release), tagged
/// `mxtune-test-server:<hash>` of source, rustc and Dockerfile; built only when missing.
pub async fn test_image_with_env(docker: &bollard::Docker, env: &[(&str, &str)]) -> String {
    use futures::StreamExt;
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _guard = LOCK.lock().await;
    let mut dockerfile = DOCKERFILE.to_string();
    for (k, v) in env {
        dockerfile.push_str(&format!("ENV {k}={v}\n"));
    }
    let tag = if env.is_empty() {
        format!("mxtune-test-server:{}", source_hash())
    } else {
        let mut h = Sha256::new();
        h.update(source_hash().as_bytes());
        h.update(dockerfile.as_bytes());
        format!("mxtune-test-server:{}", &hex::encode(h.finalize())[..12])
    };
    if docker.inspect_image(&tag).await.is_ok() {
        return tag;
    }
    let bin = tokio::task::spawn_blocking(server_binary).await.unwrap();
    let mut tar = tar::Builder::new(Vec::new());
    let dockerfile = dockerfile.as_str();
    let mut h = tar::Header::new_gnu();
    h.set_size(dockerfile.len() as u64);
    h.set_mode(0o644);
    tar.append_data(&mut h, "Dockerfile", dockerfile.as_bytes())
        .unwrap();
    tar.append_path_with_name(&bin, "test-server").unwrap();
    let context = tar.into_inner().unwrap();
    let opts = bollard::query_parameters::BuildImageOptions {
        dockerfile: "Dockerfile".into(),
        t: Some(tag.clone()),
        rm: true,
        ..Default::default()
    };
    let mut stream = docker.build_image(opts, None, Some(bollard::body_full(context.into())));
    while let Some(item) = stream.next().await {
        let info = item.expect("docker build of the test image");
        assert!(info.error_detail.is_none(), "docker build failed: {info:?}");
    }
    tag
}

/// A spec for the test server on `port`: argv, env, the log checks.
pub fn server_spec(argv0: &str, host: &str, port: u16, model: &str) -> LaunchSpec {
    LaunchSpec {
        argv: vec![
            argv0.to_string(),
            "--host".into(),
            host.into(),
            "--port".into(),
            port.to_string(),
            "--served-model-name".into(),
            model.into(),
        ],
        host: host.into(),
        port,
        served_model_name: model.into(),
        checks: vec![
            PathCheck {
                flag: "moe_backend".into(),
                value: "marlin".into(),
                must_see: vec!["(?i)marlin".into()],
                must_not_see: vec!["(?i)cutlass.*moe".into()],
            },
            PathCheck {
                flag: "cuda_graphs".into(),
                value: "on".into(),
                must_see: vec!["Capturing CUDA graphs".into()],
                must_not_see: vec!["enforce_eager=True".into()],
            },
        ],
        ..Default::default()
    }
}

/// A Docker spec for the test image, bridge network, port bound to 127.0.0.1.
pub fn docker_spec(image: &str, port: u16, model: &str) -> LaunchSpec {
    let mut spec = server_spec("/test-server", "0.0.0.0", port, model);
    spec.container = Some(ContainerSpec {
        image: image.into(),
        network: NetworkMode::Bridge,
        gpus_all: false,
        ..Default::default()
    });
    spec
}

/// Streams a completion and returns the text pieces, failing on anything but a clean
/// `[DONE]`-terminated SSE stream.
pub async fn streamed_completion(url: &str, model: &str, max_tokens: u32) -> Vec<String> {
    use futures::StreamExt;
    let resp = reqwest::Client::new()
        .post(format!("{url}/v1/completions"))
        .json(&serde_json::json!({"model": model, "prompt": "Hi", "max_tokens": max_tokens, "stream": true}))
        .send()
        .await
        .unwrap();
    assert!(
        resp.status().is_success(),
        "completion answered {}",
        resp.status()
    );
    let mut body = String::new();
    let mut stream = resp.bytes_stream();
    while let Some(b) = stream.next().await {
        body.push_str(&String::from_utf8_lossy(&b.unwrap()));
    }
    let mut pieces = Vec::new();
    let mut done = false;
    for data in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        pieces.push(v["choices"][0]["text"].as_str().unwrap().to_string());
    }
    assert!(done, "stream did not end with [DONE]: {body}");
    pieces
}

/// Collects the events sent so far.
pub fn drain(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<mxtune::launch::LaunchEvent>,
) -> Vec<mxtune::launch::LaunchEvent> {
    let mut out = Vec::new();
    while let Ok(e) = rx.try_recv() {
        out.push(e);
    }
    out
}

/// Removes every container of a run id when dropped, so a failing test leaves nothing running.
pub struct Cleanup(pub String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let run_id = self.0.clone();
        // Drop runs inside the test's runtime: do the async work on a thread of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async {
                let Ok(d) = mxtune::launch::docker::connect().await else {
                    return;
                };
                for f in mxtune::launch::docker::find_mxtune_containers(&d)
                    .await
                    .unwrap_or_default()
                {
                    if f.run_id == run_id {
                        let opts = bollard::query_parameters::RemoveContainerOptions {
                            force: true,
                            ..Default::default()
                        };
                        let _ = d.remove_container(&f.id, Some(opts)).await;
                    }
                }
            });
        })
        .join();
    }
}
