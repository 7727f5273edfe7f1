//! The CSI side: the messages (written from the spec's field numbers), the [`CsiDriver`]
//! seam the provisioner calls, and its gRPC implementation over a unix socket.
//!
//! Everything the sidecar asks of a driver goes through [`CsiDriver`]: the real driver on
//! its socket ([`GrpcCsi`]), the tests' mock driver (the same gRPC path, feature
//! `testing`) and in-process fakes are one seam.

mod grpc;
pub mod messages;

use async_trait::async_trait;
pub use tonic::{Code, Status};

pub use grpc::{AddressError, GrpcCsi, socket_path};
pub use messages::*;

/// The CSI calls the sidecar makes (Identity and Controller services).
///
/// Errors are gRPC statuses as the driver answered them; a call the client gave up on
/// (its deadline passed) is [`Code::DeadlineExceeded`], a driver that is not listening
/// [`Code::Unavailable`].
#[async_trait]
pub trait CsiDriver: Send + Sync + 'static {
    /// `Identity.Probe`.
    async fn probe(&self) -> Result<ProbeResponse, Status>;
    /// `Identity.GetPluginInfo`.
    async fn get_plugin_info(&self) -> Result<GetPluginInfoResponse, Status>;
    /// `Identity.GetPluginCapabilities`.
    async fn get_plugin_capabilities(&self) -> Result<GetPluginCapabilitiesResponse, Status>;
    /// `Controller.ControllerGetCapabilities`.
    async fn controller_get_capabilities(
        &self,
    ) -> Result<ControllerGetCapabilitiesResponse, Status>;
    /// `Controller.CreateVolume`.
    async fn create_volume(
        &self,
        request: CreateVolumeRequest,
    ) -> Result<CreateVolumeResponse, Status>;
    /// `Controller.DeleteVolume`.
    async fn delete_volume(
        &self,
        request: DeleteVolumeRequest,
    ) -> Result<DeleteVolumeResponse, Status>;
}

#[async_trait]
impl<D: CsiDriver + ?Sized> CsiDriver for std::sync::Arc<D> {
    async fn probe(&self) -> Result<ProbeResponse, Status> {
        (**self).probe().await
    }
    async fn get_plugin_info(&self) -> Result<GetPluginInfoResponse, Status> {
        (**self).get_plugin_info().await
    }
    async fn get_plugin_capabilities(&self) -> Result<GetPluginCapabilitiesResponse, Status> {
        (**self).get_plugin_capabilities().await
    }
    async fn controller_get_capabilities(
        &self,
    ) -> Result<ControllerGetCapabilitiesResponse, Status> {
        (**self).controller_get_capabilities().await
    }
    async fn create_volume(
        &self,
        request: CreateVolumeRequest,
    ) -> Result<CreateVolumeResponse, Status> {
        (**self).create_volume(request).await
    }
    async fn delete_volume(
        &self,
        request: DeleteVolumeRequest,
    ) -> Result<DeleteVolumeResponse, Status> {
        (**self).delete_volume(request).await
    }
}
