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
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result: anyhow::Result<std::process::ExitCode> = match cli.command {
        None => {
            eprintln!("mxtune: the interactive panel is not built yet; see `mxtune --help`");
            Ok(std::process::ExitCode::from(2))
        }
        Some(Command::Engine {
            command: EngineCommand::Selftest(args),
        }) => mxtune::engine::cuda::cli::selftest(&args),
        Some(Command::Engine {
            command: EngineCommand::Profile(args),
        }) => mxtune::engine::cuda::profile::run(&args).map(|()| std::process::ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mxtune: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
