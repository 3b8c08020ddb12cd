//! The `mxtune` command line: parses arguments and hands off to the library. No logic here.

use clap::{Parser, Subcommand};

/// Tune gpt-oss inference: flags, launch, live monitor, benchmarks, run records.
#[derive(Parser, Debug)]
#[command(name = "mxtune", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Live GPU, host and server metrics: a line per second, or one sample with --once --json.
    Monitor(mxtune::monitor::cli::MonitorArgs),
    /// Run records: list, show, compare (`runs/*.json`).
    Runs(mxtune::record::cli::RunsArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result: anyhow::Result<std::process::ExitCode> = match cli.command {
        None => {
            eprintln!("mxtune: the interactive panel is not built yet; see `mxtune --help`");
            Ok(std::process::ExitCode::from(2))
        }
        Some(Command::Monitor(args)) => mxtune::monitor::cli::run(args),
        Some(Command::Runs(args)) => mxtune::record::cli::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mxtune: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
