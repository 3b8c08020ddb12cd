//! Printing when the reader may go away (`mxtune … | head`, a pipe whose reader died).
//!
//! Commands that only print end at once, quietly, like any Unix filter: they restore the
//! default SIGPIPE action ([`end_with_the_reader`]). The panel, `serve` and the commands that
//! own targets, run records or Docker connections (launch, stop, bench, matrix, ab) keep
//! SIGPIPE ignored — a dropped client socket, or Docker closing its Unix socket, must not
//! kill them, and a run half done must still be finished and recorded — and print through
//! [`outln!`](crate::outln), [`out!`](crate::out) and [`errln!`](crate::errln), which drop
//! what a closed pipe cannot take instead of panicking as `println!` does.

use std::io::Write;

/// Restores the default SIGPIPE action, so a write to a pipe without a reader ends the
/// process quietly (status 141 in a shell) instead of failing with EPIPE.
pub fn end_with_the_reader() {
    // SAFETY: changing a signal's disposition has no memory-safety preconditions; it runs at
    // the start of `main`, before any thread that could be writing exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Writes to stdout, ignoring a failure: a line nobody can read is not worth stopping for.
#[doc(hidden)]
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    let _ = std::io::stdout().lock().write_fmt(args);
}

/// Writes to stderr, ignoring a failure, as [`write_stdout`].
#[doc(hidden)]
pub fn write_stderr(args: std::fmt::Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

/// `println!` that ignores a closed stdout (see the [module docs](crate::output)).
#[macro_export]
macro_rules! outln {
    () => {
        $crate::output::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` that ignores a closed stdout (see the [module docs](crate::output)).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!($($arg)*))
    };
}

/// `eprintln!` that ignores a closed stderr (see the [module docs](crate::output)).
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::output::write_stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}
