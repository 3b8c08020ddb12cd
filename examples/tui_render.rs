//! Times drawing the Live screen at 200×60 with 30 minutes of full charts (docs/perf.md).
//! Run: `cargo run --release --example tui_render`.

use mxtune::flags::preset::PresetStore;
use mxtune::monitor::Reading::Value;
use mxtune::monitor::sample::*;
use mxtune::tui::app::{App, Paths, Tab};
use mxtune::tui::theme::Theme;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use std::path::PathBuf;
use std::time::Instant;

fn sample(t: i64) -> Sample {
    let f = t as f64;
    let clocks = |sm: u32| Clocks {
        sm_mhz: Value(sm),
        graphics_mhz: Value(sm),
        mem_mhz: Value(4266),
    };
    Sample {
        at: chrono::DateTime::UNIX_EPOCH + chrono::Duration::seconds(t),
        elapsed_s: f,
        gpu: GpuStatus::Available {
            driver_version: Value("580".into()),
            cuda_driver_version: Value("13.0".into()),
            gpus: vec![GpuSample {
                index: 0,
                name: Value("NVIDIA GB10".into()),
                uuid: Value("GPU-0".into()),
                compute_capability: Value("12.1".into()),
                persistence_mode: Value(true),
                compute_mode: Value("default".into()),
                memory: GpuMemory {
                    source: MemorySource::Unified,
                    used_bytes: Value((60 << 30) + (t as u64 % 100) * (1 << 26)),
                    total_bytes: Value(119 << 30),
                    process_bytes: Value(58 << 30),
                },
                clocks: clocks(1500 + (t % 40) as u32 * 10),
                max_clocks: clocks(3003),
                power_w: Value(40.0 + (f * 0.1).sin() * 20.0),
                power_limit_w: Value(100.0),
                energy_j: Value(f),
                temperature_c: Value(55 + (t % 9) as u32),
                utilization_gpu_pct: Value(((t * 7) % 100) as u32),
                utilization_mem_pct: Value(40),
                pstate: Value("P0".into()),
                throttle_reasons: Value(vec!["sw_power_cap".into()]),
                processes: Value(vec![]),
            }],
        },
        host: HostSample {
            cpu_pct: Value(20.0 + (t % 30) as f32),
            cpu_per_core_pct: vec![],
            ram_used_bytes: 60 << 30,
            ram_total_bytes: 119 << 30,
            swap_used_bytes: 0,
            swap_total_bytes: 0,
            load: Value([1.0; 3]),
            process: None,
        },
        server: ServerStatus::Scraped(Box::new(ServerMetrics {
            url: "http://127.0.0.1:8000/metrics".into(),
            kind: ServerKind::Vllm,
            generation_tok_s: Value(50.0 + (f * 0.05).cos() * 25.0),
            prompt_tok_s: Value(1000.0 + f % 300.0),
            running: Value((t % 8) as f64),
            waiting: Value((t % 3) as f64),
            kv_cache_usage: Value(0.3 + (t % 50) as f64 / 100.0),
            spec_acceptance_rate: Value(0.6),
            spec_mean_acceptance_length: Value(2.4),
            tpot_ms: None,
            prefix_cache_hit_rate: None,
            preemptions: None,
        })),
    }
}

fn main() {
    let mut app = App::new(
        Theme {
            color: true,
            ascii: false,
        },
        Paths {
            presets: PresetStore::new(vec![PathBuf::from("presets")]),
            save_dir: PathBuf::from("presets"),
            runs_dir: PathBuf::from("runs"),
            export_dir: PathBuf::from("."),
        },
    );
    app.tab = Tab::Live;
    for t in 0..1800 {
        app.live.push(sample(t));
    }
    app.live.window = mxtune::tui::screens::live::WINDOWS.len() - 1; // 30 min: every point drawn
    let mut terminal = match Terminal::new(TestBackend::new(200, 60)) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cannot create the test terminal: {e}");
            std::process::exit(1);
        }
    };
    let draw = |terminal: &mut Terminal<TestBackend>, app: &App| {
        if let Err(e) = terminal.draw(|f| mxtune::tui::ui::draw(f, app)) {
            eprintln!("draw failed: {e}");
            std::process::exit(1);
        }
    };
    for _ in 0..20 {
        draw(&mut terminal, &app);
    }
    let n = 500;
    let mut times: Vec<f64> = Vec::with_capacity(n);
    for i in 0..n {
        // A new sample per frame, as in the real loop.
        app.live.push(sample(1800 + i as i64));
        let t = Instant::now();
        draw(&mut terminal, &app);
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    let mean = times.iter().sum::<f64>() / n as f64;
    println!(
        "Live screen 200x60, 9 charts x 30 min (1800 points/series): mean {mean:.3} ms, p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms over {n} frames",
        times[n / 2],
        times[n * 99 / 100],
        times[n - 1]
    );
}
