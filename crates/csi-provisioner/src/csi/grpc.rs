//! [`GrpcCsi`]: the [`CsiDriver`](super::CsiDriver) of a real driver on a unix socket.

/// A CSI driver reached over gRPC on a unix socket.
#[derive(Clone, Debug)]
pub struct GrpcCsi {
    _private: (),
}
