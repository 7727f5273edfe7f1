//! `create`: the claim creators alone, no controller. Their rate is the baseline for the
//! `driver_creates_per_s` of `provision`, where the same creators run beside the
//! controller: how much the controller slows another client of the API server. The
//! driver watches claims and PVs here too, as in `provision`, so the two differ by the
//! controller alone, not by the bench's own watches.

use anyhow::Context as _;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube_client::{
    Api,
    api::{DeleteParams, ListParams},
};
use serde_json::{Value, json};

use crate::{creators, env::Env, provision, track::Timeline};

pub(crate) async fn run(env: &Env) -> anyhow::Result<Value> {
    let names = &env.names;
    let n = env.args.n;
    // The run's class exists, but no controller serves its provisioner: claims stay Pending.
    env.setup(true).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(env.driver.clone(), &names.namespace);
    let timeline = Timeline::new(n);
    let watches = provision::observe(env, &timeline).await?;
    let report = creators::run(env, Some(&timeline)).await?;
    let (created, seconds) = (report.created, report.seconds);
    eprintln!("{created} claims created in {seconds:.2} s; deleting them");
    let connections_peak = env.server_connections_peak().await?;
    claims
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .context("cannot delete the claims")?;
    for handle in watches {
        handle.abort();
    }
    Ok(json!({
        "scenario": "create",
        "n": n,
        "created": created,
        "creators": env.args.in_flight,
        "seconds": (seconds * 100.0).round() / 100.0,
        "creates_per_s": report.per_second(),
        "creators_in": env.args.creators.name(),
        "sim_connections_peak": connections_peak,
    }))
}
