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
    let mut host = "0.0.0.0".to_string();
    let mut port = "8000".to_string();
    let mut model = "test-model".to_string();
    let mut files = Vec::new();
    let mut i = 1;
    while i < args.len() {
        let val = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--host" => host = val,
            "--port" => port = val,
            "--served-model-name" => model = val,
            "--print-file" => files.push(val),
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    log(&format!("INFO test-server starting, argv {:?}", &args[1..]));
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
    log("INFO [default_loader.py:262] Loading weights took 0.01 seconds");
    log("INFO [mxfp4.py:100] Using Marlin backend for MXFP4 MoE");
    log("INFO Capturing CUDA graphs (decode, FULL): 100%");
    // Docker keeps stdout and stderr apart, so their relative order is not kept: phase
    // lines go to stdout, and this line proves stderr is followed too.
    eprintln!("WARNING stderr is followed");
    log("kernel-path moe_kernel=marlin");
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
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let model = model.clone();
        std::thread::spawn(move || {
            let _ = handle(conn, &model, fatal);
        });
    }
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
