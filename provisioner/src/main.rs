//! The one binary: daemon, CLI, and CNI plugin (whenever CNI_COMMAND is set).

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
