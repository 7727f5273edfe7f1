//! kube-sim in a child process, so this process's CPU and memory are the controller's.
//!
//! The bench binary re-executes itself with `--serve-sim PATH`: the child starts kube-sim
//! with its PV binder, writes the kubeconfig to `PATH`, prints `ready` and serves until its
//! stdin closes (the parent exits or drops [`SimChild`]) or it is killed.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
};

use anyhow::{Context as _, bail};
use kube_sim::{KubeSim, LoadModel};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, BufReader},
    process::{Child, Command},
};

/// The child side: serves until stdin closes.
pub(crate) async fn serve(
    kubeconfig: &Path,
    history_window: usize,
    profile: &str,
) -> anyhow::Result<()> {
    let load = LoadModel::named(profile)
        .with_context(|| format!("no kube-sim load profile called {profile:?}"))?;
    let sim = KubeSim::builder()
        .load(load)
        .pv_binder(true)
        .history_window(history_window)
        // The bench counts requests client-side; the sim's own log would only cost memory.
        .request_log_limit(0)
        .kubeconfig_path(kubeconfig)
        .start()
        .await
        .context("cannot start kube-sim")?;
    println!("ready {}", sim.url());
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 64];
    loop {
        tokio::select! {
            read = stdin.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            },
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    sim.shutdown().await;
    Ok(())
}

/// The parent side: a running child sim.
pub(crate) struct SimChild {
    child: Child,
    /// Where the child wrote its kubeconfig.
    pub(crate) kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl SimChild {
    /// Starts the child and waits until it serves.
    pub(crate) async fn start(history_window: usize, profile: &str) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("bench-sim-")
            .tempdir()
            .context("cannot create a temporary directory")?;
        let kubeconfig = dir.path().join("kubeconfig");
        let exe = std::env::current_exe().context("cannot find the bench binary")?;
        let mut child = Command::new(exe)
            .arg("--serve-sim")
            .arg(&kubeconfig)
            .arg("--sim-history")
            .arg(history_window.to_string())
            .args(["--sim-profile", profile])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start the kube-sim child")?;
        let stdout = child.stdout.take().context("child stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .await
            .context("cannot read from the kube-sim child")?;
        if !line.starts_with("ready") {
            bail!("kube-sim child did not start (said {line:?})");
        }
        Ok(Self {
            child,
            kubeconfig,
            _dir: dir,
        })
    }

    /// The child's process id.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Closes the child's stdin and waits for it to stop.
    pub(crate) async fn stop(mut self) {
        drop(self.child.stdin.take());
        let wait = tokio::time::timeout(std::time::Duration::from_secs(10), self.child.wait());
        if wait.await.is_err() {
            let _ = self.child.kill().await;
        }
    }
}
