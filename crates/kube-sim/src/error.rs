//! Errors of starting a sim.

/// Why [`Builder::start`](crate::Builder::start) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The listening socket could not be bound.
    #[error("binding 127.0.0.1:{port} for the kube-sim API server failed")]
    Bind {
        /// The requested port (0 = any).
        port: u16,
        /// The bind error.
        #[source]
        source: std::io::Error,
    },
    /// The kubeconfig file (or its temporary directory) could not be written.
    #[error("writing the kube-sim kubeconfig to {path} failed")]
    Kubeconfig {
        /// Where the kubeconfig was to be written.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The kube client for the sim could not be built.
    #[error("building the kube client for the kube-sim API server failed")]
    Client(#[source] kube_client::Error),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
