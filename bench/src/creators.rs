//! The claim creators: `--in-flight` create requests at a time, either on the driver's own
//! thread (`--creators thread`) or in a process of their own (`--creators process`, this
//! binary started again with `--create-claims`), as a separate load generator would be on
//! a real cluster: on its own cores' share, not queued behind the driver's watches.

use std::{
    process::Stdio,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube_client::{Api, Client, api::PostParams};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::{
    Args, CreatorsKind,
    env::Env,
    objects::{self, Names},
    track::{Step, Timeline},
};

/// What a creators run reports.
#[derive(Debug, Default, Deserialize, Serialize)]
pub(crate) struct Created {
    /// Claims the API server accepted.
    pub(crate) created: usize,
    /// From the first request sent to the last answer.
    pub(crate) seconds: f64,
    /// When each claim's request was sent (Unix time, ns), by claim index; 0 = not sent.
    sent_unix_ns: Vec<u128>,
}

impl Created {
    /// Creates per second.
    pub(crate) fn per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            (self.created as f64 / self.seconds * 10.0).round() / 10.0
        } else {
            0.0
        }
    }

    /// Marks every claim's send time in `timeline`.
    fn mark_sent(&self, timeline: &Timeline) {
        // One clock pair maps the other process's wall-clock times to this one's instants.
        let (now, unix_now) = (Instant::now(), unix_ns());
        for (i, &sent) in self.sent_unix_ns.iter().enumerate() {
            if sent == 0 || i >= timeline.len() {
                continue;
            }
            let ago = Duration::from_nanos(
                u64::try_from(unix_now.saturating_sub(sent)).unwrap_or(u64::MAX),
            );
            if let Some(at) = now.checked_sub(ago) {
                timeline.mark_at(i, Step::Sent, at);
            }
        }
    }
}

fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Creates claims `0..n` of `names` with `client`, `in_flight` at a time.
async fn create(client: Client, names: &Names, n: usize, in_flight: usize) -> Created {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client, &names.namespace);
    let mut sent_unix_ns = vec![0; n];
    let started = Instant::now();
    let results: Vec<(usize, u128, bool)> = futures::stream::iter(0..n)
        .map(|i| {
            let claims = claims.clone();
            let claim = objects::claim(names, i, None);
            async move {
                let sent = unix_ns();
                let ok = claims.create(&PostParams::default(), &claim).await.is_ok();
                (i, sent, ok)
            }
        })
        .buffer_unordered(in_flight.max(1))
        .collect()
        .await;
    let seconds = started.elapsed().as_secs_f64();
    let mut created = 0;
    for (i, sent, ok) in results {
        sent_unix_ns[i] = sent;
        created += usize::from(ok);
    }
    Created {
        created,
        seconds,
        sent_unix_ns,
    }
}

/// `--create-claims`: the creators in a process of their own; the report on stdout.
pub(crate) async fn create_claims_main(
    kubeconfig: &std::path::Path,
    args: &Args,
) -> anyhow::Result<()> {
    let client = crate::env::client_from_kubeconfig(kubeconfig).await?;
    let names = Names::from_run(&args.run_id);
    let report = create(client, &names, args.n, args.in_flight).await;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Creates the run's `n` claims as `--creators` says, marking their send times in
/// `timeline` (when given).
pub(crate) async fn run(env: &Env, timeline: Option<&Timeline>) -> anyhow::Result<Created> {
    let (n, in_flight) = (env.args.n, env.args.in_flight);
    let report = match env.args.creators {
        CreatorsKind::Thread => create(env.driver.clone(), &env.names, n, in_flight).await,
        CreatorsKind::Process => {
            let exe = std::env::current_exe().context("cannot find the bench binary")?;
            let output = tokio::process::Command::new(exe)
                .arg("--create-claims")
                .arg(env.kubeconfig())
                .args(["--run-id", &env.names.run])
                .args(["--n", &n.to_string()])
                .args(["--in-flight", &in_flight.to_string()])
                .stdin(Stdio::null())
                .stderr(Stdio::inherit())
                .output()
                .await
                .context("cannot start the creators' process")?;
            if !output.status.success() {
                bail!("the creators' process failed ({})", output.status);
            }
            serde_json::from_slice(&output.stdout)
                .context("cannot read the creators' process's report")?
        }
    };
    if let Some(timeline) = timeline {
        report.mark_sent(timeline);
    }
    Ok(report)
}
