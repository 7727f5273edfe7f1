//! An in-process CSI driver for the provisioner's tests: plain Rust behind the
//! `CsiDriver` seam (no gRPC), recording every request, with scripted answers.

#![allow(dead_code, unreachable_pub)]

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
};

use async_trait::async_trait;
use csi_provisioner::csi::{
    ControllerGetCapabilitiesResponse, CreateVolumeRequest, CreateVolumeResponse, CsiDriver,
    DeleteVolumeRequest, DeleteVolumeResponse, GetPluginCapabilitiesResponse,
    GetPluginInfoResponse, ProbeResponse, Status, Topology, Volume,
};
use tokio::sync::Notify;

/// The driver's name in the tests.
pub const DRIVER: &str = "fake.csi.example.com";

/// What the next CreateVolume does.
#[derive(Clone, Debug)]
pub enum Step {
    /// Make the volume (or find it by name) and answer it.
    Succeed,
    /// Answer the status; make nothing.
    Fail(Status),
    /// Make the volume, then answer the status (a create that landed after the client
    /// gave up).
    LandThenFail(Status),
    /// Wait for [`FakeCsi::release`], then make the volume and answer the status.
    HoldThenLandAndFail(Status),
}

#[derive(Default)]
struct Inner {
    /// name -> volume.
    volumes: BTreeMap<String, Volume>,
    creates: Vec<CreateVolumeRequest>,
    deletes: Vec<DeleteVolumeRequest>,
    script: VecDeque<Step>,
    delete_errors: VecDeque<Status>,
    next_id: u64,
    /// The capacity answered; `None`: the request's.
    capacity: Option<i64>,
    context: HashMap<String, String>,
    topology: Vec<Topology>,
    /// Answer CreateVolume without a volume.
    no_volume: bool,
}

/// The fake driver; clones share their state.
#[derive(Clone, Default)]
pub struct FakeCsi {
    inner: Arc<Mutex<Inner>>,
    held: Arc<Notify>,
    release: Arc<Notify>,
}

impl FakeCsi {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next CreateVolume calls do these, in order (then succeed).
    pub fn script(&self, steps: impl IntoIterator<Item = Step>) -> &Self {
        self.lock().script.extend(steps);
        self
    }

    /// The next DeleteVolume calls answer these statuses.
    pub fn fail_deletes(&self, statuses: impl IntoIterator<Item = Status>) -> &Self {
        self.lock().delete_errors.extend(statuses);
        self
    }

    /// Answer this capacity (0: unknown).
    pub fn capacity(&self, bytes: i64) -> &Self {
        self.lock().capacity = Some(bytes);
        self
    }

    /// Answer this volume context.
    pub fn context(&self, context: &[(&str, &str)]) -> &Self {
        self.lock().context = context
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self
    }

    /// Answer CreateVolume with no volume at all.
    pub fn answer_no_volume(&self) -> &Self {
        self.lock().no_volume = true;
        self
    }

    /// Waits until a CreateVolume is held by [`Step::HoldThenLandAndFail`].
    pub async fn held(&self) {
        self.held.notified().await;
    }

    /// Lets the held CreateVolume go on.
    pub fn release(&self) {
        self.release.notify_one();
    }

    /// The volumes that exist, by name.
    pub fn volumes(&self) -> BTreeMap<String, Volume> {
        self.lock().volumes.clone()
    }

    /// Every CreateVolume request, in order.
    pub fn creates(&self) -> Vec<CreateVolumeRequest> {
        self.lock().creates.clone()
    }

    /// Every DeleteVolume request, in order.
    pub fn deletes(&self) -> Vec<DeleteVolumeRequest> {
        self.lock().deletes.clone()
    }

    /// Makes (or finds) the volume `request` names.
    fn make(&self, request: &CreateVolumeRequest) -> Volume {
        let mut inner = self.lock();
        if let Some(existing) = inner.volumes.get(&request.name) {
            return existing.clone();
        }
        inner.next_id += 1;
        let requested = request.capacity_range.map_or(0, |r| r.required_bytes);
        let volume = Volume {
            capacity_bytes: inner.capacity.unwrap_or(requested),
            volume_id: format!("vol-{}", inner.next_id),
            volume_context: inner.context.clone(),
            content_source: None,
            accessible_topology: inner.topology.clone(),
        };
        inner.volumes.insert(request.name.clone(), volume.clone());
        volume
    }
}

#[async_trait]
impl CsiDriver for FakeCsi {
    async fn probe(&self) -> Result<ProbeResponse, Status> {
        Ok(ProbeResponse::default())
    }
    async fn get_plugin_info(&self) -> Result<GetPluginInfoResponse, Status> {
        Ok(GetPluginInfoResponse {
            name: DRIVER.into(),
            ..GetPluginInfoResponse::default()
        })
    }
    async fn get_plugin_capabilities(&self) -> Result<GetPluginCapabilitiesResponse, Status> {
        Ok(GetPluginCapabilitiesResponse::default())
    }
    async fn controller_get_capabilities(
        &self,
    ) -> Result<ControllerGetCapabilitiesResponse, Status> {
        Ok(ControllerGetCapabilitiesResponse::default())
    }
    async fn create_volume(
        &self,
        request: CreateVolumeRequest,
    ) -> Result<CreateVolumeResponse, Status> {
        let step = {
            let mut inner = self.lock();
            inner.creates.push(request.clone());
            inner.script.pop_front().unwrap_or(Step::Succeed)
        };
        match step {
            Step::Succeed => {}
            Step::Fail(status) => return Err(status),
            Step::LandThenFail(status) => {
                self.make(&request);
                return Err(status);
            }
            Step::HoldThenLandAndFail(status) => {
                self.held.notify_one();
                self.release.notified().await;
                self.make(&request);
                return Err(status);
            }
        }
        let volume = self.make(&request);
        if self.lock().no_volume {
            return Ok(CreateVolumeResponse { volume: None });
        }
        Ok(CreateVolumeResponse {
            volume: Some(volume),
        })
    }
    async fn delete_volume(
        &self,
        request: DeleteVolumeRequest,
    ) -> Result<DeleteVolumeResponse, Status> {
        let mut inner = self.lock();
        inner.deletes.push(request.clone());
        if let Some(status) = inner.delete_errors.pop_front() {
            return Err(status);
        }
        // An unknown id is deleted already (the spec: answer OK).
        inner
            .volumes
            .retain(|_, volume| volume.volume_id != request.volume_id);
        Ok(DeleteVolumeResponse {})
    }
}
