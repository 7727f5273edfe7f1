//! Builds the controller's [`kube_client::Client`]: one HTTP/2 connection for every request
//! and watch, and a second one for leader election (kube-controller-kit's `client`).
//!
//! ```no_run
//! # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
//! let (client, config) = provision_controller::client::infer().await?;
//! provision_controller::client::check(&client, &config).await?;
//! let leader_client = provision_controller::client::for_leader_election(&config)?;
//! # Ok(())
//! # }
//! ```

pub use kube_controller_kit::client::{
    ClientError, check, for_leader_election, from_config, infer,
};
