//! `mxtune runs list|show|compare`: reading the runs directory from the command line.

use super::compare::{self, Format};
use super::schema::{RunRecord, RunStatus, Stats, Verdict};
use super::store::{RunStore, Scan, StoredRun, find_in};
use anyhow::{Context, Result, bail};
use chrono::{DateTime, NaiveDate, Utc};
use clap::{Args, Subcommand};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// The runs directory option, shared by every command that reads or writes records.
#[derive(Args, Debug, Clone)]
pub struct RunsDirArg {
    /// Directory holding run records.
    #[arg(long = "runs-dir", value_name = "DIR", env = "MXTUNE_RUNS_DIR", default_value = super::store::DEFAULT_RUNS_DIR, global = true)]
    pub runs_dir: PathBuf,
}

impl RunsDirArg {
    /// The store this option points at.
    pub fn store(&self) -> RunStore {
        RunStore::new(&self.runs_dir)
    }
}

/// `mxtune runs …`
#[derive(Args, Debug)]
pub struct RunsArgs {
    #[command(subcommand)]
    command: RunsCommand,
    #[command(flatten)]
    dir: RunsDirArg,
}

#[derive(Subcommand, Debug)]
enum RunsCommand {
    /// List runs, newest first; unreadable files are reported by name with the reason.
    List {
        /// Only runs of this preset.
        #[arg(long)]
        preset: Option<String>,
        /// Only runs started at or after DATE (2026-01-17, RFC 3339) or within DURATION
        /// (30m, 24h, 7d, 2w).
        #[arg(long, value_name = "DATE|DURATION")]
        since: Option<String>,
    },
    /// Show one run in full; ID is a run id prefix, the short id, or the file name.
    Show {
        /// Run id (prefix), short id or file name.
        id: String,
        /// Print the whole record as JSON (migrated to the current schema, secrets redacted).
        #[arg(long)]
        json: bool,
    },
    /// Compare runs against the first: a delta table per metric with a noise hint.
    Compare {
        /// Two or more runs; the first is the baseline.
        #[arg(num_args = 2.., required = true)]
        ids: Vec<String>,
        /// `text` for the terminal, `md` for BENCHMARK_RESULTS.md.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Noise threshold in standard deviations: a change smaller than K times the
        /// noisier run's std is marked "within noise".
        #[arg(long, value_name = "K", default_value_t = compare::DEFAULT_NOISE_SIGMAS, value_parser = compare::parse_noise_sigmas)]
        noise: f64,
    },
}

/// Run a `runs` subcommand.
pub fn run(args: RunsArgs) -> Result<ExitCode> {
    let store = args.dir.store();
    match args.command {
        RunsCommand::List { preset, since } => {
            let since = since
                .as_deref()
                .map(|s| parse_since(s, Utc::now()))
                .transpose()?;
            let scan = store.scan()?;
            print!("{}", render_list(&scan, preset.as_deref(), since));
            report_bad(&scan);
            Ok(ExitCode::SUCCESS)
        }
        RunsCommand::Show { id, json } => {
            let run = store.find(&id)?;
            if json {
                let text = serde_json::to_string_pretty(&run.record)
                    .with_context(|| format!("cannot serialize {}", run.path.display()))?;
                println!("{text}");
            } else {
                print!("{}", render_show(&run));
            }
            Ok(ExitCode::SUCCESS)
        }
        RunsCommand::Compare { ids, format, noise } => {
            let scan = store.scan()?;
            let mut records = Vec::new();
            for id in &ids {
                match find_in(&scan.runs, id).as_slice() {
                    [one] => records.push(one.record.clone()),
                    [] => bail!(
                        "no run matches `{id}` in {} (see `mxtune runs list`)",
                        store.dir().display()
                    ),
                    many => bail!(
                        "`{id}` matches {} runs in {}; give more characters of the id",
                        many.len(),
                        store.dir().display()
                    ),
                }
            }
            print!("{}", compare::render(&records, format, noise));
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn report_bad(scan: &Scan) {
    for b in &scan.bad {
        eprintln!("mxtune: skipped {}: {}", b.path.display(), b.reason);
    }
    if !scan.leftover_temps.is_empty() {
        eprintln!(
            "mxtune: {} temp file(s) from interrupted writes (e.g. {}); safe to delete when no mxtune is running",
            scan.leftover_temps.len(),
            scan.leftover_temps[0].display()
        );
    }
}

/// Parse `--since`: a date, an RFC 3339 time, or a duration back from `now`.
pub fn parse_since(s: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>> {
    let s = s.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    if let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(d.and_time(chrono::NaiveTime::MIN).and_utc());
    }
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: i64 = num.parse().with_context(|| {
        format!("--since `{s}`: expected a date (2026-01-17), an RFC 3339 time or a duration (30m, 24h, 7d, 2w)")
    })?;
    let secs = match unit {
        "s" => 1,
        "m" | "min" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => bail!("--since `{s}`: unknown unit `{unit}`; use s, m, h, d or w (e.g. 24h)"),
    };
    let d = n
        .checked_mul(secs)
        .and_then(chrono::TimeDelta::try_seconds)
        .with_context(|| format!("--since `{s}` is too large"))?;
    Ok(now - d)
}

/// Status as shown in tables: a `running` record whose writer is gone shows as
/// `interrupted` (see [`interrupted`]); the file itself is never rewritten for it.
pub fn status_text(r: &RunRecord) -> String {
    if interrupted(r) {
        "interrupted".to_string()
    } else {
        r.identity.status.as_str().to_string()
    }
}

/// A `running` record written on this host whose writer cannot be running any more: the
/// machine has booted since (boot id), or no live process has its pid. A record from
/// another host, or without a pid, cannot be judged here and stays `running`.
pub fn interrupted(r: &RunRecord) -> bool {
    if r.identity.status != RunStatus::Running {
        return false;
    }
    let Some(pid) = r.identity.pid else {
        return false;
    };
    let this_host = sysinfo::System::host_name().ok();
    if let (Some(then), Some(now)) = (&r.environment.host.hostname, &this_host)
        && then != now
    {
        return false;
    }
    match (&r.identity.boot_id, super::schema::boot_id()) {
        (Some(then), Some(now)) if *then != now => return true,
        (Some(_), _) => {}
        // Older records carry no boot id: only a known host name makes the pid meaningful.
        (None, _) if r.environment.host.hostname.is_none() || this_host.is_none() => {
            return false;
        }
        (None, _) => {}
    }
    !process_alive(pid)
}

/// A process of this pid exists and has not exited (a zombie has).
fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z"),
        Err(_) => false,
    }
}

fn headline(r: &RunRecord) -> String {
    let tps =
        |name: &str, s: &Option<Stats>| s.map(|s| format!("{name} {:.2}±{:.2}", s.mean, s.std));
    r.results
        .iter()
        .find_map(|p| {
            tps(&format!("tg{}", p.point.tg), &p.tg_tps)
                .or_else(|| tps(&format!("pp{}", p.point.pp), &p.pp_tps))
        })
        .unwrap_or_else(|| "-".into())
}

/// The `runs list` table.
pub fn render_list(scan: &Scan, preset: Option<&str>, since: Option<DateTime<Utc>>) -> String {
    let runs: Vec<&StoredRun> = scan
        .runs
        .iter()
        .filter(|r| preset.is_none_or(|p| r.record.target.preset.as_deref() == Some(p)))
        .filter(|r| since.is_none_or(|t| r.record.identity.started_at >= t))
        .collect();
    if runs.is_empty() {
        return "no runs\n".to_string();
    }
    let mut rows = vec![
        [
            "STARTED (UTC)",
            "ID",
            "PRESET",
            "TARGET",
            "STATUS",
            "POINTS",
            "FIRST RESULT t/s",
            "NOTE",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for r in runs {
        let rec = &r.record;
        rows.push(vec![
            rec.identity
                .started_at
                .format("%Y-%m-%d %H:%M:%S")
                .to_string(),
            rec.identity.run_id.to_string(),
            rec.target.preset.clone().unwrap_or_else(|| "-".into()),
            rec.target.kind_name().to_string(),
            status_text(rec),
            rec.results.len().to_string(),
            headline(rec),
            rec.identity.note.clone().unwrap_or_default(),
        ]);
    }
    super::compare::align(&rows)
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(T::to_string).unwrap_or_else(|| "-".into())
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

/// The `runs show` summary.
pub fn render_show(run: &StoredRun) -> String {
    let r = &run.record;
    let id = &r.identity;
    let mut o = String::new();
    let _ = writeln!(o, "run       {}  ({})", id.run_id, run.path.display());
    let _ = writeln!(
        o,
        "status    {}{}",
        status_text(r),
        id.reason
            .as_deref()
            .map(|x| format!(": {x}"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        o,
        "started   {}   ended {}",
        id.started_at.to_rfc3339(),
        id.ended_at
            .map(|t| t.to_rfc3339())
            .unwrap_or_else(|| "-".into())
    );
    let _ = writeln!(
        o,
        "mxtune    {} (git {})",
        id.mxtune_version,
        opt(&id.mxtune_git_sha)
    );
    if let Some(n) = &id.note {
        let _ = writeln!(o, "note      {n}");
    }
    if !id.tags.is_empty() {
        let _ = writeln!(o, "tags      {}", id.tags.join(", "));
    }

    let t = &r.target;
    let _ = writeln!(
        o,
        "\ntarget    {}  preset {}",
        t.kind_name(),
        opt(&t.preset)
    );
    let _ = writeln!(
        o,
        "model     {}  weights {}",
        opt(&t.model),
        t.weights
            .map(|w| format!("{w:?}").to_lowercase())
            .unwrap_or_else(|| "-".into())
    );
    if let Some(u) = &t.url {
        let _ = writeln!(o, "url       {u}");
    }
    if let Some(d) = &t.docker {
        let _ = writeln!(
            o,
            "image     {}  id {}  digest {}",
            d.image,
            opt(&d.image_id),
            opt(&d.digest)
        );
    }
    if let Some(e) = &t.engine {
        let _ = writeln!(o, "engine    {}  {}", e.path, opt(&e.version));
    }
    if let Some(d) = t.launch.as_ref().and_then(|l| l.dialect.as_ref()) {
        let mut line = format!("dialect   {}", d.flavour);
        if let Some(v) = &d.vllm_version {
            line.push_str(&format!(
                "  rendered for vLLM {v} ({})",
                d.version_source.as_deref().unwrap_or("-")
            ));
        }
        if let Some(seen) = &r.observed.vllm_version {
            line.push_str(&format!("  image announced {seen}"));
        }
        let _ = writeln!(o, "{line}");
        if let Some(n) = &d.note {
            let _ = writeln!(o, "          {n}");
        }
    }
    if let Some(l) = &t.launch {
        let _ = writeln!(o, "argv      {}", shell_words::join(&l.argv));
        for (k, v) in &l.env {
            let _ = writeln!(o, "env       {k}={v}");
        }
    }
    if !t.flags.is_null() {
        let _ = writeln!(o, "flags     {}", t.flags);
    }

    let e = &r.environment;
    let h = &e.host;
    let _ = writeln!(
        o,
        "\nhost      {}  {}  kernel {}",
        opt(&h.hostname),
        opt(&h.os),
        opt(&h.kernel)
    );
    let _ = writeln!(
        o,
        "cpu       {}  ({} cores, {} threads)  RAM {}",
        opt(&h.cpu_model),
        opt(&h.cpu_cores),
        opt(&h.cpu_threads),
        h.ram_total_bytes.map(gib).unwrap_or_else(|| "-".into())
    );
    for g in &e.gpus {
        let _ = writeln!(
            o,
            "gpu {}     {}  {}  driver {}  CUDA {}  SM {}/{} MHz  mem {}/{} MHz  power limit {} W  persistence {}  compute {}",
            g.index,
            opt(&g.name),
            opt(&g.uuid),
            opt(&g.driver_version),
            opt(&g.cuda_version),
            opt(&g.sm_clock_mhz),
            opt(&g.sm_clock_max_mhz),
            opt(&g.mem_clock_mhz),
            opt(&g.mem_clock_max_mhz),
            opt(&g.power_limit_w),
            opt(&g.persistence_mode),
            opt(&g.compute_mode),
        );
    }
    if let Some(err) = &e.gpu_error {
        let _ = writeln!(o, "gpu       {err}");
    }
    for s in &e.source_repos {
        let _ = writeln!(
            o,
            "source    {} {}  {}{}{}",
            s.name,
            s.path,
            opt(&s.sha),
            if s.dirty == Some(true) {
                " (dirty)"
            } else {
                ""
            },
            s.error
                .as_deref()
                .map(|x| format!("  error: {x}"))
                .unwrap_or_default()
        );
    }
    if let Some(p) = &e.pip_freeze {
        let _ = writeln!(
            o,
            "pip       {} packages (full list in the record)",
            p.len()
        );
    }

    let ob = &r.observed;
    if !ob.kernel_path.is_empty() || ob.startup_s.is_some() || !ob.phases.is_empty() {
        let _ = writeln!(
            o,
            "\nstart-up  {}",
            ob.startup_s
                .map(|s| format!("{s:.1} s"))
                .unwrap_or_else(|| "-".into())
        );
        for p in &ob.phases {
            let _ = writeln!(o, "phase     {}  {}", p.at.format("%H:%M:%S%.3f"), p.name);
            if let Some(probe) = &p.last_probe {
                let _ = writeln!(
                    o,
                    "            last probe {}: {probe}",
                    probe.at.format("%H:%M:%S")
                );
            }
        }
        for k in &ob.kernel_path {
            let v = match k.verdict {
                Verdict::Valid => "valid",
                Verdict::Invalid => "INVALID",
                Verdict::Unknown => "unknown",
            };
            let _ = writeln!(
                o,
                "kernel    {}={}: {v}{}",
                k.flag,
                k.value,
                k.reason
                    .as_deref()
                    .map(|x| format!(" ({x})"))
                    .unwrap_or_default()
            );
            for l in k.lines.iter().take(3) {
                let _ = writeln!(o, "            | {l}");
            }
        }
    }
    for w in &ob.warnings {
        let _ = writeln!(o, "warning   {w}");
    }

    if let Some(w) = &r.workload {
        let _ = writeln!(
            o,
            "\nworkload  endpoint {}  runs {}  warm-up {}  temperature {}  seed {}  tokenizer {}  no-cache {}  latency {}",
            opt(&w.endpoint),
            w.runs,
            w.warmup,
            opt(&w.temperature),
            opt(&w.seed),
            opt(&w.tokenizer),
            w.no_cache,
            opt(&w.latency_mode)
        );
    }
    if !r.results.is_empty() {
        let mut rows = vec![
            [
                "test",
                "pp t/s",
                "tg t/s",
                "TTFT p50 ms",
                "TPOT p50 ms",
                "ITL p50 ms",
                "E2EL p50 ms",
                "requests",
                "errors",
            ]
            .map(String::from)
            .to_vec(),
        ];
        let st = |s: &Option<Stats>| {
            s.map(|s| format!("{:.2} ± {:.2}", s.mean, s.std))
                .unwrap_or_else(|| "-".into())
        };
        let p50 = |s: &Option<super::schema::LatencyStats>| {
            s.map(|s| format!("{:.2}", s.p50))
                .unwrap_or_else(|| "-".into())
        };
        for p in &r.results {
            rows.push(vec![
                p.point.label(),
                st(&p.pp_tps),
                st(&p.tg_tps),
                p50(&p.latency.ttft_ms),
                p50(&p.latency.tpot_ms),
                p50(&p.latency.itl_ms),
                p50(&p.latency.e2el_ms),
                p.requests.to_string(),
                p.errors.to_string(),
            ]);
        }
        o.push('\n');
        o.push_str(&super::compare::align(&rows));
    }
    if let Some(res) = &r.resources {
        let _ = writeln!(
            o,
            "\nresources GPU memory peak {} ({})  SM clock min/mean {}/{} MHz  power mean {} W  temp max {} °C",
            res.gpu_memory_peak_bytes
                .map(gib)
                .unwrap_or_else(|| "-".into()),
            opt(&res.gpu_memory_source),
            res.sm_clock_min_mhz
                .map(|x| format!("{x:.0}"))
                .unwrap_or_else(|| "-".into()),
            res.sm_clock_mean_mhz
                .map(|x| format!("{x:.0}"))
                .unwrap_or_else(|| "-".into()),
            res.power_mean_w
                .map(|x| format!("{x:.1}"))
                .unwrap_or_else(|| "-".into()),
            res.temp_max_c
                .map(|x| format!("{x:.0}"))
                .unwrap_or_else(|| "-".into()),
        );
        let _ = writeln!(
            o,
            "          host CPU mean/max {}/{} %  target RSS peak {}  samples {}",
            res.host_cpu_mean_pct
                .map(|x| format!("{x:.1}"))
                .unwrap_or_else(|| "-".into()),
            res.host_cpu_max_pct
                .map(|x| format!("{x:.1}"))
                .unwrap_or_else(|| "-".into()),
            res.target_rss_peak_bytes
                .map(gib)
                .unwrap_or_else(|| "-".into()),
            res.samples
        );
        if let Some(n) = res.server_preemptions {
            let _ = writeln!(
                o,
                "          server pre-empted {n} request(s) while watched{}",
                if n > 0 {
                    " (its KV cache was short for the load)"
                } else {
                    ""
                }
            );
        }
        for th in &res.throttle {
            let _ = writeln!(
                o,
                "throttle  {} from {} to {} ({} samples)",
                th.reason,
                th.first_seen.format("%H:%M:%S"),
                th.last_seen.format("%H:%M:%S"),
                th.samples
            );
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn since_accepts_dates_times_and_durations() {
        let now = Utc.with_ymd_and_hms(2026, 1, 17, 12, 0, 0).unwrap();
        let at = |s: &str| parse_since(s, now).unwrap();
        assert_eq!(
            at("2026-01-10"),
            Utc.with_ymd_and_hms(2026, 1, 10, 0, 0, 0).unwrap()
        );
        assert_eq!(
            at("2026-01-16T08:30:00+02:00"),
            Utc.with_ymd_and_hms(2026, 1, 16, 6, 30, 0).unwrap()
        );
        assert_eq!(at("90s"), now - chrono::TimeDelta::seconds(90));
        assert_eq!(at("30m"), now - chrono::TimeDelta::minutes(30));
        assert_eq!(at("24h"), now - chrono::TimeDelta::hours(24));
        assert_eq!(at("7d"), now - chrono::TimeDelta::days(7));
        assert_eq!(at("2w"), now - chrono::TimeDelta::days(14));
        for bad in ["", "h", "5y", "yesterday", "99999999999999999999d"] {
            assert!(parse_since(bad, now).is_err(), "{bad:?} should be rejected");
        }
    }
}
