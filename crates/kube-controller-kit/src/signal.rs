//! The signals that stop the process: SIGTERM (what the kubelet sends) and SIGINT (Ctrl-C).
//!
//! A controller in a pod must stop gracefully on SIGTERM: the kubelet sends it, and a
//! process that only waits for Ctrl-C (`tokio::signal::ctrl_c`) is killed at once, leaving
//! its lease held until it expires. [`shutdown_signal`] waits for either signal; pass it
//! as the `shutdown` future of a controller's `run`.

use std::fmt;
use std::future::Future;
use std::io;

/// The signal that asked the process to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Signal {
    /// SIGTERM: the kubelet stopping the pod, `kill`, systemd.
    Terminate,
    /// SIGINT: Ctrl-C.
    Interrupt,
}

impl Signal {
    /// The exit code of a process killed by this signal (128 + its number: 143 for
    /// SIGTERM, 130 for SIGINT), for a binary that exits at once on a second signal.
    #[must_use]
    pub fn exit_code(self) -> u8 {
        match self {
            Self::Terminate => 128 + 15,
            Self::Interrupt => 128 + 2,
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Terminate => "SIGTERM",
            Self::Interrupt => "SIGINT",
        })
    }
}

/// Installs handlers for SIGTERM and SIGINT now, and returns a future that completes with
/// the first of them to arrive (a signal that arrives before the future is polled is not
/// lost). Pass it, or a future awaiting it, as the `shutdown` of a controller's `run`
/// (provision-controller's `ProvisionController::run`, vsphere-controllers' `run`): the
/// graceful stop then starts, that is the drain and the lease release.
///
/// Only a binary should call this: once installed, the handlers replace the default
/// action of both signals (ending the process) for the rest of the process's life, so a
/// second signal does nothing unless the binary acts on it, for example by calling this
/// again after the first signal and exiting with [`Signal::exit_code`] when it completes.
/// Outside Unix, only Ctrl-C is handled.
///
/// # Errors
/// When a handler cannot be installed (no Tokio runtime with signal support, or the
/// operating system refused).
///
/// ```no_run
/// # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
/// let signal = kube_controller_kit::signal::shutdown_signal()?;
/// let shutdown = async move {
///     let signal = signal.await;
///     eprintln!("{signal}: stopping");
/// };
/// # let _ = shutdown;
/// # Ok(()) }
/// ```
#[cfg(unix)]
pub fn shutdown_signal() -> io::Result<impl Future<Output = Signal> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => Signal::Terminate,
            _ = interrupt.recv() => Signal::Interrupt,
        }
    })
}

/// Installs a Ctrl-C handler now and returns a future that completes when it fires (see
/// the Unix version, which also handles SIGTERM).
///
/// # Errors
/// Never at installation; a failure to listen later completes the future.
#[cfg(not(unix))]
pub fn shutdown_signal() -> io::Result<impl Future<Output = Signal> + Send + 'static> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
        Signal::Interrupt
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_killed_by_a_signal_exits_128_plus_its_number() {
        assert_eq!(Signal::Terminate.exit_code(), 143);
        assert_eq!(Signal::Interrupt.exit_code(), 130);
        assert_eq!(Signal::Terminate.to_string(), "SIGTERM");
        assert_eq!(Signal::Interrupt.to_string(), "SIGINT");
    }
}
