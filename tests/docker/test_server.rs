//! Test double for a vLLM-like server, used by mxtune's launch tests as a container
//! entrypoint (built static, in a `FROM scratch` image) and as an engine child process.
//! Std only, so `rustc` builds it in a second without dependencies.
//!
//! Arguments: --host H (0.0.0.0), --port N (8000), --served-model-name M (test-model),
//! --print-file PATH (repeatable: prints the file, proving it was placed before start).
//! Environment: MXTUNE_TEST_CRASH=CODE exits with CODE during start-up;
//! MXTUNE_TEST_FATAL=1 logs an EngineCore failure but keeps serving (completions fail);
//! MXTUNE_TEST_SILENT_MS=N sleeps N ms without a log line before serving;
//! any VLLM_BOGUS_* variable is reported the way vLLM reports unknown variables.
//! MXTUNE_TEST_SM=121 (a compute capability) makes it print upstream vLLM's own start-up lines
//! instead: the MXFP4 MoE backend chosen from the VLLM_USE_FLASHINFER_MOE_MXFP4_* /
//! VLLM_MXFP4_USE_MARLIN variables in upstream's order (or its refusal, then exit 1), the
//! attention backend, the CUDA graph mode and capture. Which backend runs on which device is
//! this double's own table (`runs_on`), not upstream's.
//! MXTUNE_TEST_VLLM_VERSION=0.12.0 (default 0.11.2) is the upstream release it plays: `vllm
//! --version` prints it, the upstream start-up prints it in vLLM's banner, and like that
//! release it refuses `--attention-backend` before 0.13.0 (reading VLLM_ATTENTION_BACKEND).
//!
//! Called as `ray` (the image has it at /usr/local/bin/ray) it plays a Ray node for the
//! two-node tests: `ray start --head --port=P --node-ip-address=IP --block` listens on IP:P and
//! keeps the table of nodes (each with MXTUNE_TEST_GPUS GPUs, default 1); `ray start
//! --address=IP:P --node-ip-address=IP --block` joins it and stays a node while it runs
//! (MXTUNE_TEST_RAY_JOIN=never: it never reaches the head); `ray status --address=IP:P` prints
//! the table the way `ray status` does. Their start-up lines are Ray's. `vllm serve …
//! --distributed-executor-backend ray` connects to the head of its container, refuses to start
//! without the GPUs its tensor/pipeline sizes need, and prints NCCL's INFO lines for the link
//! between the nodes: IB/RoCE, or sockets when NCCL_IB_DISABLE=1 (as NCCL does).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};

unsafe extern "C" {
    fn signal(signum: i32, handler: extern "C" fn(i32)) -> usize;
    fn _exit(code: i32) -> !;
}

extern "C" fn on_term(_: i32) {
    // Only async-signal-safe calls here.
    unsafe { _exit(0) }
}

fn log(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn main() {
    unsafe {
        signal(15, on_term);
        signal(2, on_term);
    }
    let args: Vec<String> = std::env::args().collect();
    if args[0].rsplit('/').next() == Some("ray") {
        ray_main(&args[1..]);
    }
    let version = std::env::var("MXTUNE_TEST_VLLM_VERSION").unwrap_or_else(|_| "0.11.2".into());
    if args.get(1).map(String::as_str) == Some("--version") {
        log(&version);
        return;
    }
    let release: Vec<u32> = version.split('.').map(|p| p.parse().unwrap_or(0)).collect();
    let before_attention_cli = (release.first().copied().unwrap_or(0), release.get(1).copied().unwrap_or(0)) < (0, 13);
    let mut host = "0.0.0.0".to_string();
    let mut port = "8000".to_string();
    let mut model = "test-model".to_string();
    let mut files = Vec::new();
    let mut attention: Option<String> = None;
    let mut compilation = String::new();
    let mut eager = false;
    let mut i = 1;
    while i < args.len() {
        let val = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--host" => host = val,
            "--port" => port = val,
            "--served-model-name" => model = val,
            "--print-file" => files.push(val),
            "--attention-backend" => attention = Some(val),
            "--compilation-config" => compilation = val,
            "--enforce-eager" => {
                eager = true;
                i += 1;
                continue;
            }
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    log(&format!("INFO test-server starting, argv {:?}", &args[1..]));
    if args.windows(2).any(|w| w[0] == "--distributed-executor-backend" && w[1] == "ray") {
        ray_executor(&args);
    }
    for (k, _) in std::env::vars() {
        if k.starts_with("VLLM_BOGUS") {
            log(&format!("WARNING [envs.py:1] Unknown vLLM environment variable detected: {k}"));
        }
    }
    for f in &files {
        match std::fs::read_to_string(f) {
            Ok(s) => log(&format!("file {f}: {}", s.trim())),
            Err(e) => log(&format!("file {f}: missing ({e})")),
        }
    }
    let upstream_sm: Option<u32> = std::env::var("MXTUNE_TEST_SM").ok().and_then(|v| v.parse().ok());
    if let Some(sm) = upstream_sm {
        if before_attention_cli && let Some(b) = &attention {
            eprintln!("vllm: error: unrecognized arguments: --attention-backend {b}");
            std::process::exit(2);
        }
        log(&format!("(APIServer pid=1) INFO 11-25 10:00:00 [api_server.py:1839] vLLM API server version {version}"));
        if let Ok(b) = std::env::var("VLLM_ATTENTION_BACKEND") {
            if !before_attention_cli {
                log("WARNING 11-25 10:00:00 [attention.py:1] Using VLLM_ATTENTION_BACKEND environment variable is deprecated and will be removed in v0.14.0 or v1.0.0, whichever is soonest. Please use --attention-config.backend command line argument or AttentionConfig(backend=...) config field instead.");
            }
            attention.get_or_insert(b);
        }
        let no_graphs = eager || compilation.replace(' ', "").contains("\"cudagraph_mode\":\"NONE\"");
        let mode = if no_graphs { "<CUDAGraphMode.NONE: 0>" } else { "<CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>" };
        log(&format!(
            "INFO 11-25 10:00:00 [core.py:93] Initializing a V1 LLM engine (v{version}) with config: model='openai/gpt-oss-120b', enforce_eager={}, compilation_config={{'level': 3, 'cudagraph_mode': {mode}, 'cudagraph_num_of_warmups': 1}}",
            if eager { "True" } else { "False" }
        ));
        log("(EngineCore_DP0 pid=42) INFO 11-25 10:00:01 [gpu_model_runner.py:2602] Starting to load model openai/gpt-oss-120b...");
        match &attention {
            Some(b) => log(&format!("(EngineCore_DP0 pid=42) INFO 11-25 10:00:01 [cuda.py:366] Using AttentionBackendEnum.{b} backend.")),
            None => log("(EngineCore_DP0 pid=42) INFO 11-25 10:00:01 [cuda.py:403] Using TRITON_ATTN attention backend out of potential backends: ['TRITON_ATTN']"),
        }
        match upstream_mxfp4_backend(sm) {
            Ok(b) => log(&format!("(EngineCore_DP0 pid=42) INFO 11-25 10:00:01 [mxfp4.py:271] Using '{b}' Mxfp4 MoE backend.")),
            Err(e) => {
                log("(EngineCore_DP0 pid=42) ERROR 11-25 10:00:01 [core.py:708] EngineCore failed to start.");
                log(&format!("(EngineCore_DP0 pid=42) ERROR 11-25 10:00:01 [core.py:708] ValueError: {e}"));
                log("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}");
                std::process::exit(1);
            }
        }
        log("(EngineCore_DP0 pid=42) INFO 11-25 10:00:02 [default_loader.py:267] Loading weights took 0.01 seconds");
        if !no_graphs {
            log("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 11/11");
            log("(EngineCore_DP0 pid=42) INFO 11-25 10:00:03 [gpu_model_runner.py:3480] Graph capturing finished in 1 secs, took 0.31 GiB");
        }
    } else {
        log("INFO [default_loader.py:262] Loading weights took 0.01 seconds");
        log("INFO [mxfp4.py:100] Using Marlin backend for MXFP4 MoE");
        log("INFO Capturing CUDA graphs (decode, FULL): 100%");
    }
    // Docker keeps stdout and stderr apart, so their relative order is not kept: phase
    // lines go to stdout, and this line proves stderr is followed too.
    eprintln!("WARNING stderr is followed");
    // MXTUNE_TEST_LATE_PATH_MS: the kernel-path line comes that long after the port opens,
    // as when the ready probe wins the race against the log pipe.
    let late_path: Option<u64> =
        std::env::var("MXTUNE_TEST_LATE_PATH_MS").ok().and_then(|v| v.parse().ok());
    if late_path.is_none() {
        log("kernel-path moe_kernel=marlin");
    }
    if let Ok(code) = std::env::var("MXTUNE_TEST_CRASH") {
        eprintln!("ERROR fatal: simulated crash during start-up");
        std::process::exit(code.parse().unwrap_or(1));
    }
    let fatal = std::env::var("MXTUNE_TEST_FATAL").is_ok();
    if fatal {
        eprintln!("ERROR RuntimeError: EngineCore failed to start.");
    }
    if let Some(ms) = std::env::var("MXTUNE_TEST_SILENT_MS").ok().and_then(|v| v.parse().ok()) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    let listener = match TcpListener::bind(format!("{host}:{port}")) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("ERROR cannot bind {host}:{port}: {e}");
            std::process::exit(4);
        }
    };
    log(&format!("INFO Uvicorn running on http://{host}:{port}"));
    if let Some(ms) = late_path {
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(ms));
            log("kernel-path moe_kernel=marlin");
        });
    }
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let model = model.clone();
        std::thread::spawn(move || {
            let _ = handle(conn, &model, fatal);
        });
    }
}

/// Whether this double lets `backend` run on compute capability `sm`.
fn runs_on(backend: &str, sm: u32) -> bool {
    match backend {
        "MARLIN" => sm >= 75,
        "FLASHINFER_TRTLLM_MXFP4_BF16" | "FLASHINFER_TRTLLM_MXFP4_MXFP8" => sm / 10 == 10,
        "FLASHINFER_CUTLASS_MXFP4_BF16" => sm == 90,
        "FLASHINFER_CUTLASS_MXFP4_MXFP8" => matches!(sm / 10, 10 | 12),
        "TRITON" => (90..110).contains(&sm),
        _ => false,
    }
}

/// Upstream's order: the BF16 switch, the MXFP8 switch, the CUTLASS MXFP8 switch, the Marlin
/// switch, then the first candidate the device runs. An explicit choice it cannot run is refused.
fn upstream_mxfp4_backend(sm: u32) -> Result<&'static str, String> {
    let flag = |k: &str| std::env::var(k).ok().map(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    let explicit = |b: &'static str| {
        if runs_on(b, sm) {
            Ok(b)
        } else {
            Err(format!("Mxfp4 MoE backend '{b}' does not support the deployment configuration."))
        }
    };
    let mut candidates = vec![
        "FLASHINFER_TRTLLM_MXFP4_BF16",
        "TRITON",
        "FLASHINFER_CUTLASS_MXFP4_BF16",
        "MARLIN",
    ];
    match flag("VLLM_USE_FLASHINFER_MOE_MXFP4_BF16") {
        Some(false) => candidates.retain(|b| !b.ends_with("_BF16")),
        Some(true) if sm == 90 => return explicit("FLASHINFER_CUTLASS_MXFP4_BF16"),
        Some(true) if sm / 10 == 10 => return explicit("FLASHINFER_TRTLLM_MXFP4_BF16"),
        Some(true) => {
            return Err("VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1 is set but the current device capability is not supported. Only SM90 (CUTLASS) and SM100+ (TRTLLM) are supported.".into());
        }
        None => {}
    }
    if flag("VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8") == Some(true) {
        return explicit("FLASHINFER_TRTLLM_MXFP4_MXFP8");
    }
    if flag("VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS") == Some(true) {
        return explicit("FLASHINFER_CUTLASS_MXFP4_MXFP8");
    }
    if flag("VLLM_MXFP4_USE_MARLIN") == Some(true) {
        return explicit("MARLIN");
    }
    candidates
        .into_iter()
        .find(|b| runs_on(b, sm))
        .ok_or_else(|| "No MXFP4 MoE backend supports the deployment configuration.".to_string())
}

fn respond(s: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn chunk(s: &mut TcpStream, data: &str) -> std::io::Result<()> {
    write!(s, "{:x}\r\n{data}\r\n", data.len())?;
    s.flush()
}

fn number_after(body: &str, key: &str) -> Option<usize> {
    let at = body.find(key)? + key.len();
    let rest = body[at..].trim_start_matches(|c: char| c == '"' || c == ':' || c.is_whitespace());
    rest.chars().take_while(char::is_ascii_digit).collect::<String>().parse().ok()
}

fn handle(mut s: TcpStream, model: &str, fatal: bool) -> std::io::Result<()> {
    let mut reader = BufReader::new(s.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body)?;
    let body = String::from_utf8_lossy(&body).to_string();
    let path = request_line.split_whitespace().nth(1).unwrap_or("");
    match path {
        "/health" => respond(&mut s, "200 OK", ""),
        "/v1/models" => respond(
            &mut s,
            "200 OK",
            &format!("{{\"object\":\"list\",\"data\":[{{\"id\":\"{model}\",\"object\":\"model\"}}]}}"),
        ),
        "/v1/completions" if fatal => respond(
            &mut s,
            "500 Internal Server Error",
            "{\"error\":{\"message\":\"EngineCore is dead\",\"type\":\"internal_error\"}}",
        ),
        "/v1/completions" => {
            let n = number_after(&body, "\"max_tokens\"").unwrap_or(4).clamp(1, 64);
            let stream = body.replace(' ', "").contains("\"stream\":true");
            if !stream {
                let text: String = (0..n).map(|i| format!(" tok{i}")).collect();
                return respond(
                    &mut s,
                    "200 OK",
                    &format!(
                        "{{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"model\":\"{model}\",\"choices\":[{{\"index\":0,\"text\":\"{text}\",\"finish_reason\":\"length\"}}],\"usage\":{{\"prompt_tokens\":1,\"completion_tokens\":{n},\"total_tokens\":{}}}}}",
                        n + 1
                    ),
                );
            }
            write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            )?;
            for i in 0..n {
                let finish = if i + 1 == n { "\"length\"" } else { "null" };
                chunk(
                    &mut s,
                    &format!(
                        "data: {{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"model\":\"{model}\",\"choices\":[{{\"index\":0,\"text\":\" tok{i}\",\"finish_reason\":{finish}}}]}}\n\n"
                    ),
                )?;
            }
            chunk(&mut s, "data: [DONE]\n\n")?;
            write!(s, "0\r\n\r\n")
        }
        _ => respond(&mut s, "404 Not Found", "{\"error\":{\"message\":\"not found\"}}"),
    }
}

// ---- Ray and the Ray executor -------------------------------------------------------------

const RAY_CURRENT_CLUSTER: &str = "/tmp/ray/ray_current_cluster";

fn flag_value<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let eq = format!("{name}=");
    args.iter().enumerate().find_map(|(i, a)| {
        if let Some(v) = a.strip_prefix(&eq) {
            Some(v)
        } else if a == name {
            args.get(i + 1).map(String::as_str)
        } else {
            None
        }
    })
}

fn gpus_here() -> u32 {
    std::env::var("MXTUNE_TEST_GPUS").ok().and_then(|v| v.parse().ok()).unwrap_or(1)
}

fn node_id(ip: &str, port: u16) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in format!("{ip}:{port}:{}", std::process::id()).bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    format!("{h:016x}{:016x}{:016x}", h.rotate_left(17), h.rotate_left(41))
}

fn ray_main(args: &[String]) -> ! {
    match args.first().map(String::as_str) {
        Some("start") if args.iter().any(|a| a == "--head") => ray_head(args),
        Some("start") => ray_worker(args),
        Some("status") => {
            let address = flag_value(args, "--address")
                .map(String::from)
                .or_else(|| std::fs::read_to_string(RAY_CURRENT_CLUSTER).ok())
                .unwrap_or_default();
            match ask_head(address.trim(), "STATUS") {
                Ok(text) => {
                    print!("{text}");
                    std::process::exit(0)
                }
                Err(e) => {
                    eprintln!("ConnectionError: Could not find any running Ray instance at {address}: {e}");
                    std::process::exit(1)
                }
            }
        }
        other => {
            eprintln!("ray: unknown command {other:?}");
            std::process::exit(2)
        }
    }
}

fn ask_head(address: &str, what: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(address)?;
    writeln!(s, "{what}")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

struct RayNode {
    id: String,
    ip: String,
    gpus: u32,
}

fn ray_head(args: &[String]) -> ! {
    use std::sync::{Arc, Mutex};
    let port: u16 = flag_value(args, "--port").and_then(|p| p.parse().ok()).unwrap_or(6379);
    let ip = flag_value(args, "--node-ip-address").unwrap_or("127.0.0.1").to_string();
    let listener = match TcpListener::bind((ip.as_str(), port)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("ValueError: Failed to bind to {ip}:{port}: {e}");
            std::process::exit(1)
        }
    };
    let _ = std::fs::create_dir_all("/tmp/ray");
    let _ = std::fs::write(RAY_CURRENT_CLUSTER, format!("{ip}:{port}"));
    let nodes = Arc::new(Mutex::new(vec![RayNode { id: node_id(&ip, port), ip: ip.clone(), gpus: gpus_here() }]));
    log("Usage stats collection is disabled.");
    log("");
    log(&format!("Local node IP: {ip}"));
    log("");
    log("--------------------");
    log("Ray runtime started.");
    log("--------------------");
    log("");
    log("Next steps");
    log("  To add another node to this Ray cluster, run");
    log(&format!("    ray start --address='{ip}:{port}'"));
    log("");
    log("  To terminate the Ray runtime, run");
    log("    ray stop");
    log("");
    log("--block");
    log("  This command will now block forever until terminated by a signal.");
    log("  Running subprocesses are monitored and a message will be printed if any of them terminate unexpectedly. Subprocesses exit with SIGTERM will be treated as graceful, thus NOT reported.");
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let nodes = nodes.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(match conn.try_clone() {
                Ok(c) => c,
                Err(_) => return,
            });
            let mut first = String::new();
            if reader.read_line(&mut first).is_err() {
                return;
            }
            let words: Vec<&str> = first.split_whitespace().collect();
            let mut conn = conn;
            match words.as_slice() {
                ["JOIN", node_ip, gpus] => {
                    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
                    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let id = node_id(&format!("{node_ip}#{seq}"), port);
                    nodes.lock().unwrap().push(RayNode { id: id.clone(), ip: node_ip.to_string(), gpus: gpus.parse().unwrap_or(0) });
                    // The node is alive while its connection is open.
                    let mut rest = Vec::new();
                    let _ = reader.read_to_end(&mut rest);
                    nodes.lock().unwrap().retain(|n| n.id != id);
                }
                ["STATUS"] => {
                    let _ = conn.write_all(status_text(&nodes.lock().unwrap()).as_bytes());
                }
                ["NODES"] => {
                    let list: Vec<String> = nodes.lock().unwrap().iter().map(|n| format!("{} {}", n.ip, n.gpus)).collect();
                    let _ = conn.write_all(list.join("\n").as_bytes());
                }
                _ => {}
            }
        });
    }
    std::process::exit(1)
}

fn status_text(nodes: &[RayNode]) -> String {
    let gpus: u32 = nodes.iter().map(|n| n.gpus).sum();
    let mut t = String::from("======== Autoscaler status: 2025-11-26 10:00:00.000000 ========\nNode status\n---------------------------------------------------------------\nActive:\n");
    for n in nodes {
        t.push_str(&format!(" 1 node_{}\n", n.id));
    }
    t.push_str("Pending:\n (no pending nodes)\nRecent failures:\n (no failures)\n\nResources\n---------------------------------------------------------------\nUsage:\n");
    t.push_str(&format!(" 0.0/{}.0 CPU\n 0.0/{gpus}.0 GPU\n 0B/{}.00GiB memory\n\nDemands:\n (no resource demands)\n", 20 * nodes.len(), 100 * nodes.len()));
    t
}

fn ray_worker(args: &[String]) -> ! {
    let address = flag_value(args, "--address").unwrap_or("").trim_matches('\'').to_string();
    let ip = flag_value(args, "--node-ip-address").unwrap_or("127.0.0.1").to_string();
    log(&format!("Local node IP: {ip}"));
    if std::env::var("MXTUNE_TEST_RAY_JOIN").as_deref() == Ok("never") {
        // Like a worker whose packets to the head are dropped: it waits and says nothing more.
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
    let mut conn = None;
    for _ in 0..100 {
        match TcpStream::connect(&address) {
            Ok(c) => {
                conn = Some(c);
                break;
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    }
    let Some(mut conn) = conn else {
        eprintln!("ConnectionError: Unable to connect to GCS at {address}. Check that (1) Ray GCS with matching version started successfully at the specified address, and (2) there is no firewall setting preventing access.");
        std::process::exit(1)
    };
    if writeln!(conn, "JOIN {ip} {}", gpus_here()).is_err() {
        std::process::exit(1)
    }
    log("");
    log("--------------------");
    log("Ray runtime started.");
    log("--------------------");
    log("");
    log("To terminate the Ray runtime, run");
    log("  ray stop");
    log("");
    log("--block");
    log("  This command will now block forever until terminated by a signal.");
    let mut rest = Vec::new();
    let _ = conn.read_to_end(&mut rest);
    eprintln!("Some Ray subprocesses exited unexpectedly:");
    eprintln!("  raylet [exit code=1]");
    std::process::exit(1)
}

/// `vllm serve … --distributed-executor-backend ray`: join the local Ray head, check the GPUs
/// and print NCCL's view of the link; the caller then serves as usual.
fn ray_executor(args: &[String]) {
    let size = |name: &str| flag_value(args, name).and_then(|v| v.parse::<u32>().ok()).unwrap_or(1);
    let (tp, pp) = (size("--tensor-parallel-size"), size("--pipeline-parallel-size"));
    let address = std::fs::read_to_string(RAY_CURRENT_CLUSTER).unwrap_or_default();
    let address = address.trim();
    log(&format!("INFO 11-26 10:00:00 [worker.py:1832] Connecting to existing Ray cluster at address: {address}..."));
    let nodes = match ask_head(address, "NODES") {
        Ok(t) => t,
        Err(e) => {
            eprintln!("ConnectionError: Could not find any running Ray instance. Please specify the one to connect to by setting `--address` flag or `RAY_ADDRESS` environment variable. ({e})");
            std::process::exit(1)
        }
    };
    log("INFO 11-26 10:00:00 [worker.py:2003] Connected to Ray cluster.");
    let nodes: Vec<(String, u32)> = nodes
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(ip, g)| (ip.to_string(), g.parse().unwrap_or(0))))
        .collect();
    let gpus: u32 = nodes.iter().map(|n| n.1).sum();
    log(&format!(
        "INFO 11-26 10:00:01 [core.py:93] Initializing a V1 LLM engine with config: tensor_parallel_size={tp}, pipeline_parallel_size={pp}, distributed_executor_backend=ray"
    ));
    if gpus < tp * pp {
        eprintln!("ValueError: The number of required GPUs exceeds the total number of available GPUs in the placement group. (required {}, available {gpus})", tp * pp);
        std::process::exit(1);
    }
    let iface = std::env::var("NCCL_SOCKET_IFNAME").unwrap_or_else(|_| "eth0".into());
    let hca = std::env::var("NCCL_IB_HCA").unwrap_or_else(|_| "mlx5_0".into());
    let socket = std::env::var("NCCL_IB_DISABLE").as_deref() == Ok("1");
    for (rank, (ip, _)) in nodes.iter().enumerate().take(2) {
        let prefix = if rank == 0 { String::new() } else { format!("(RayWorkerWrapper pid={}, ip={ip}) ", 200 + rank) };
        let who = format!("{prefix}spark{rank}:{0}:{0} [0]", 100 + rank);
        log(&format!("{who} NCCL INFO Bootstrap : Using {iface}:{ip}<0>"));
        if socket {
            log(&format!("{who} NCCL INFO NCCL_IB_DISABLE set by environment to 1."));
            log(&format!("{who} NCCL INFO NET/Socket : Using [0]{iface}:{ip}<0>"));
            log(&format!("{who} NCCL INFO Using network Socket"));
        } else {
            log(&format!("{who} NCCL INFO NET/IB : Using [0]{hca}:1/RoCE [RO]; OOB {iface}:{ip}<0>"));
            log(&format!("{who} NCCL INFO Using network IB"));
        }
        let via = if socket { "NET/Socket/0" } else { "NET/IB/0" };
        log(&format!("{who} NCCL INFO Channel 00/0 : {rank}[0] -> {}[0] [send] via {via}", 1 - rank));
    }
}
