//! Builds the controller's [`kube_client::Client`]: one HTTP/2 connection for every request
//! and watch (where the server offers HTTP/2), and a second one for leader election
//! (kube-controller-kit's `client`, with its errors as [`Error::Client`]).
//!
//! ```no_run
//! # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
//! let (client, config) = provision_controller::client::infer().await?;
//! provision_controller::client::check(&client, &config).await?;
//! let leader_client = provision_controller::client::for_leader_election(&config)?;
//! # Ok(())
//! # }
//! ```

use kube_client::{Client, Config};

use crate::Error;

fn client_error(error: kube_controller_kit::client::ClientError) -> Error {
    Error::Client(error.into())
}

/// Finds the configuration as kube does (`KUBECONFIG`, `~/.kube/config`, else the pod's
/// service account) and builds a client on it ([`from_config`]). This reads the
/// environment: call it from a binary, not from a library.
///
/// # Errors
/// [`Error::Client`] when no configuration is found or it is unusable (the reason never
/// quotes a kubeconfig's content).
///
/// # Panics
/// Outside a Tokio runtime: the client spawns its buffer task.
pub async fn infer() -> Result<(Client, Config), Error> {
    kube_controller_kit::client::infer()
        .await
        .map_err(client_error)
}

/// Asks the API server of `config` for its version, so that a binary stops at start with
/// one clear line ([`error_chain`](crate::error_chain)) when the server cannot be reached
/// or refuses the credentials, instead of retrying in the background.
///
/// # Errors
/// [`Error::Client`] when no answer came (connection refused, host not found, TLS) or the
/// server answered with an error status (401: the credentials were refused).
pub async fn check(client: &Client, config: &Config) -> Result<(), Error> {
    kube_controller_kit::client::check(client, config)
        .await
        .map_err(client_error)
}

/// Builds a client from `config` that negotiates HTTP/2 with the API server and shares one
/// connection among all its requests and watches (clones of the client included), with
/// the config's TLS, authentication, impersonation, timeouts and retries. Every call builds
/// a new connection pool: build one client and clone it.
///
/// # Errors
/// [`Error::Client`] when the TLS material or authentication settings are unusable.
///
/// # Panics
/// Outside a Tokio runtime: the client spawns its buffer task.
pub fn from_config(config: Config) -> Result<Client, Error> {
    kube_controller_kit::client::from_config(config).map_err(client_error)
}

/// Builds a client for leader election alone, from the same `config` the workers use: its
/// own connection, so lease renewals never wait behind worker requests, and no retries of
/// its own (the elector bounds and retries its attempts). Pass it to
/// [`ProvisionController::leader_election_client`](crate::ProvisionController::leader_election_client).
///
/// # Errors
/// [`Error::Client`] when the TLS material or authentication settings are unusable.
///
/// # Panics
/// Outside a Tokio runtime: the client spawns its buffer task.
pub fn for_leader_election(config: &Config) -> Result<Client, Error> {
    kube_controller_kit::client::for_leader_election(config).map_err(client_error)
}
