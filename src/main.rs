//! The `mxtune` command line: parses arguments and hands off to the library. No logic here.

use clap::{Args, Parser, Subcommand};

/// Tune gpt-oss inference: flags, launch, live monitor, benchmarks, run records.
#[derive(Parser, Debug)]
#[command(name = "mxtune", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    tui: TuiArgs,
}

/// Options of the interactive panel (no subcommand).
#[derive(Args, Debug)]
struct TuiArgs {
    /// ASCII-only glyphs for terminals without Unicode.
    #[arg(long, env = "MXTUNE_ASCII")]
    ascii: bool,
    /// No colours (the NO_COLOR environment variable works too).
    #[arg(long)]
    no_color: bool,
    /// Capture the mouse (breaks copy/paste over SSH, hence off by default).
    #[arg(long)]
    mouse: bool,
    /// Start the panel on this preset (default: the one loaded last time, remembered in
    /// ~/.config/mxtune/panel.toml, else engine-cpu-tiny).
    #[arg(long, value_name = "NAME")]
    preset: Option<String>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run configurations: list, show (as docker run / vllm / env / engine), diff, check.
    Presets(mxtune::flags::cli::PresetsArgs),
    /// Benchmark an OpenAI-compatible server: pp/tg grid, correctness and stress levels.
    Bench(mxtune::bench::cli::BenchArgs),
    /// Run records: list, show, compare (`runs/*.json`).
    Runs(mxtune::record::cli::RunsArgs),
    /// Run presets through the test levels unattended (resumable), with a report and charts.
    Matrix(Box<mxtune::matrix::cli::MatrixArgs>),
    /// Alternate two presets A B A B … and report the B/A ratio per metric.
    Ab(Box<mxtune::matrix::cli::AbArgs>),
    /// Import a sparkrun / Spark Arena recipe as a preset, or export a preset as a recipe.
    Recipe(mxtune::matrix::recipe::RecipeArgs),
    /// Serve gpt-oss with the bundled engine over an OpenAI-compatible HTTP API.
    Serve(mxtune::engine::serve::ServeArgs),
    /// Live GPU, host and server metrics: a line per second, or one sample with --once --json.
    Monitor(mxtune::monitor::cli::MonitorArgs),
    /// Launch a target (Docker container, bundled engine, or attach to a URL), wait until it
    /// is ready, print phases and the kernel-path verdict, and leave it running.
    Launch(Box<mxtune::launch::cli::LaunchArgs>),
    /// Stop containers and engine processes mxtune started.
    Stop(mxtune::launch::cli::StopArgs),
    /// Launch's pre-flight host checks for a rendered spec, on this machine (`launch --host`
    /// runs them on the host this way).
    Preflight(mxtune::launch::cli::PreflightArgs),
    /// Remote hosts of ~/.config/mxtune/hosts.toml (for --host): list, check.
    Hosts(mxtune::hosts::cli::HostsArgs),
    /// The bundled inference engine.
    Engine {
        #[command(subcommand)]
        command: EngineCommand,
    },
}

#[derive(Subcommand, Debug)]
enum EngineCommand {
    /// Check every CUDA kernel against the CPU reference on random inputs.
    Selftest(mxtune::engine::cuda::cli::SelftestArgs),
    /// Time one decode step of a synthetic model on the GPU, kernel by kernel.
    Profile(mxtune::engine::cuda::profile::ProfileArgs),
    /// Summarize a served run's step timeline (`mxtune serve --step-log FILE`).
    Steps(mxtune::engine::steplog::StepsArgs),
}

/// Whether the command only prints, and so should end quietly when its reader goes away
/// (`mxtune presets list | head -1`). The others keep SIGPIPE ignored and print through
/// `mxtune::outln!`: the panel and `serve` must outlive a dropped client socket, and launch,
/// stop, bench, matrix and ab hold Docker's Unix socket (a write to a closed one raises
/// SIGPIPE), targets and run records, which must be finished rather than abandoned.
fn ends_with_its_reader(command: &Option<Command>) -> bool {
    matches!(
        command,
        Some(
            Command::Presets(_)
                | Command::Runs(_)
                | Command::Recipe(_)
                | Command::Monitor(_)
                | Command::Engine { .. }
        )
    )
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if ends_with_its_reader(&cli.command) {
        mxtune::output::end_with_the_reader();
    }
    let result: anyhow::Result<std::process::ExitCode> = match cli.command {
        None => mxtune::tui::run(mxtune::tui::Options {
            ascii: cli.tui.ascii,
            no_color: cli.tui.no_color,
            mouse: cli.tui.mouse,
            preset: cli.tui.preset.clone(),
        })
        .map(|exit| match exit {
            mxtune::tui::Exit::Quit => std::process::ExitCode::SUCCESS,
            mxtune::tui::Exit::Signal(sig) => std::process::ExitCode::from(128 + sig as u8),
        }),
        Some(Command::Presets(args)) => mxtune::flags::cli::run(args),
        Some(Command::Bench(args)) => mxtune::bench::cli::run(args),
        Some(Command::Runs(args)) => mxtune::record::cli::run(args),
        Some(Command::Matrix(args)) => mxtune::matrix::cli::matrix(*args),
        Some(Command::Ab(args)) => mxtune::matrix::cli::ab(*args),
        Some(Command::Recipe(args)) => mxtune::matrix::recipe::run(args),
        Some(Command::Serve(args)) => mxtune::engine::serve::run(args),
        Some(Command::Monitor(args)) => mxtune::monitor::cli::run(args),
        Some(Command::Launch(args)) => mxtune::launch::cli::launch(*args),
        Some(Command::Stop(args)) => mxtune::launch::cli::stop(args),
        Some(Command::Hosts(args)) => mxtune::hosts::cli::run(args),
        Some(Command::Preflight(args)) => mxtune::launch::cli::preflight(args),
        Some(Command::Engine {
            command: EngineCommand::Selftest(args),
        }) => mxtune::engine::cuda::cli::selftest(&args),
        Some(Command::Engine {
            command: EngineCommand::Profile(args),
        }) => mxtune::engine::cuda::profile::run(&args).map(|()| std::process::ExitCode::SUCCESS),
        Some(Command::Engine {
            command: EngineCommand::Steps(args),
        }) => mxtune::engine::steplog::run(&args).map(|()| std::process::ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            mxtune::errln!("mxtune: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
