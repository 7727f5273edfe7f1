//! [`DriverSlots`]: how many driver calls run at once ([`Config::threads`](crate::Config::threads)).

use std::{future::Future, time::Duration};

use tokio::sync::Semaphore;
use tracing::Instrument as _;

use super::calls;

/// Bounds on concurrent driver calls, one per flow (Go: `Threadiness` claim workers and
/// as many volume workers, each holding its slot for a whole sync).
pub(crate) struct DriverSlots {
    provision: Semaphore,
    delete: Semaphore,
}

impl DriverSlots {
    pub(crate) fn new(threads: usize) -> Self {
        Self {
            provision: Semaphore::new(threads),
            delete: Semaphore::new(threads),
        }
    }

    /// A driver call of the claim flow (`provision`, also a cleanup's), bounded by `limit`
    /// with panics caught ([`calls::call`]), once a provision slot is free; the wait for
    /// the slot is not part of `limit` (a call that never started cannot have run).
    pub(crate) async fn provisioning<T>(
        &self,
        limit: Option<Duration>,
        call: impl Future<Output = T>,
    ) -> Result<T, calls::CallError> {
        let traced = async {
            let _slot = self.provision.acquire().await;
            calls::call(limit, call).await
        };
        traced
            .instrument(tracing::debug_span!("driver_provision"))
            .await
    }

    /// A driver call of the volume flow (`delete`, `volume_saved`),
    /// as [`provisioning`](Self::provisioning) with a delete slot.
    pub(crate) async fn deleting<T>(
        &self,
        limit: Option<Duration>,
        call: impl Future<Output = T>,
    ) -> Result<T, calls::CallError> {
        let _slot = self.delete.acquire().await;
        calls::call(limit, call).await
    }
}
