//! `matrix`: `provision` for every combination of workers, crash safety and claim count,
//! each run in a process of its own (its own kube-sim child, a fresh controller), then one
//! Markdown table of the figures `docs/performance.md` quotes.

use std::process::Command;

use anyhow::Context as _;
use serde_json::Value;
use tokio::time::Instant;

use crate::Args;

/// One run's settings.
#[derive(Clone, Copy, Debug)]
struct Cell {
    workers: u16,
    crash_safe: bool,
    n: usize,
}

/// Runs every cell, printing each report's JSON line to stderr as it finishes and the table
/// on stdout at the end (`--json`: the reports as one JSON array instead).
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the bench binary")?;
    let mut rows = Vec::new();
    for &n in &args.matrix_n {
        for &workers in &args.matrix_workers {
            for &crash_safe in &args.matrix_crash_safe {
                let cell = Cell {
                    workers: workers.get(),
                    crash_safe,
                    n,
                };
                eprintln!("matrix: {cell:?}");
                let started = Instant::now();
                let mut command = Command::new(&exe);
                command
                    .arg("provision")
                    .args(["--n", &n.to_string()])
                    .args(["--workers", &cell.workers.to_string()])
                    .args(["--crash-safe", &crash_safe.to_string()])
                    .args(["--sim-profile", &args.sim_profile])
                    .args(["--sim-history", &args.sim_history.to_string()])
                    .args(["--in-flight", &args.in_flight.to_string()])
                    .args(["--timeout-secs", &args.timeout_secs.to_string()])
                    .arg("--json");
                if let Some(secs) = args.resync_secs {
                    command.args(["--resync-secs", &secs.to_string()]);
                }
                let output = command
                    .stderr(std::process::Stdio::inherit())
                    .output()
                    .context("cannot start a provision run")?;
                let seconds = started.elapsed().as_secs_f64();
                let report: Value = String::from_utf8_lossy(&output.stdout)
                    .lines()
                    .rev()
                    .find_map(|line| serde_json::from_str(line).ok())
                    .unwrap_or(Value::Null);
                if report.is_null() {
                    eprintln!("matrix: {cell:?} produced no report ({})", output.status);
                } else {
                    eprintln!("{report}");
                }
                rows.push((cell, seconds, report));
            }
        }
    }
    if args.json {
        let reports: Vec<&Value> = rows.iter().map(|(_, _, r)| r).collect();
        println!("{}", serde_json::to_string(&reports)?);
    } else {
        print!("{}", table(&args.sim_profile, &rows));
    }
    Ok(())
}

/// A number at `path` in `v`, formatted with `digits` decimals, or `-`.
fn num(v: &Value, path: &[&str], digits: usize) -> String {
    let mut at = v;
    for key in path {
        at = &at[*key];
    }
    at.as_f64()
        .map_or_else(|| "-".to_owned(), |x| format!("{x:.digits$}"))
}

fn table(profile: &str, rows: &[(Cell, f64, Value)]) -> String {
    let mut out = format!(
        "kube-sim profile: {profile}\n\n\
         | workers | crash safety | claims | PV created/s | claim -> PV p50 / p95 / p99 ms \
         | claim -> Bound p99 ms | controller writes / reads per volume \
         | server writes / reads per volume (all clients) | binder writes per volume \
         | CPU-s per 1,000 | RSS MiB | run s |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for (cell, seconds, r) in rows {
        let done = r["incomplete"].is_null() && !r.is_null();
        let pv = &["provision", "latency_created_to_pv"];
        let lat = |p: &str| num(r, &[pv[0], pv[1], p], 0);
        let per = &r["api_requests"]["per_volume_provision"];
        let reads = ["get", "list"]
            .iter()
            .filter_map(|v| per["per_object_by_verb"][*v].as_f64())
            .sum::<f64>();
        let server = &r["server_requests"]["provision"];
        out.push_str(&format!(
            "| {} | {} | {} | {}{} | {} / {} / {} | {} | {} / {reads:.2} | {} / {} | {} | {} | {} | {seconds:.0} |\n",
            cell.workers,
            if cell.crash_safe { "on" } else { "off" },
            cell.n,
            num(r, &["provision", "pv_created_per_s"], 0),
            if done { "" } else { " (incomplete)" },
            lat("p50_ms"),
            lat("p95_ms"),
            lat("p99_ms"),
            num(r, &["provision", "latency_created_to_bound", "p99_ms"], 0),
            num(per, &["writes_per_object"], 2),
            num(server, &["writes_per_object"], 2),
            num(server, &["reads_per_object"], 2),
            num(server, &["by_client", "pv-binder", "writes"], 2),
            num(r, &["cpu", "controller_s_per_1000_provisioned"], 2),
            num(r, &["memory_mib", "all_bound"], 1),
        ));
    }
    out.push_str(
        "\nPV created/s: claims whose PV exists / time from the first claim sent to the last PV \
         seen. CPU-s per 1,000: the controller's CPU while provisioning (driver thread \
         subtracted). Server counts are kube-sim's own (/metrics), over the provision phase: \
         they include the driver's one claim create per volume and the sim's PV binder.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn table_rows_carry_the_report_figures() {
        let report = json!({
            "incomplete": null,
            "provision": {
                "pv_created_per_s": 812.4,
                "latency_created_to_pv": {"p50_ms": 40.0, "p95_ms": 90.0, "p99_ms": 120.0},
                "latency_created_to_bound": {"p99_ms": 300.0},
            },
            "api_requests": {"per_volume_provision": {
                "writes_per_object": 3.0,
                "per_object_by_verb": {"get": 0.0, "list": 0.5},
            }},
            "server_requests": {"provision": {
                "writes_per_object": 7.5, "reads_per_object": 0.5,
                "by_client": {"pv-binder": {"writes": 3.5}},
            }},
            "cpu": {"controller_s_per_1000_provisioned": 1.25},
            "memory_mib": {"all_bound": 22.0},
        });
        let cell = Cell {
            workers: 16,
            crash_safe: true,
            n: 1000,
        };
        let text = table(
            "realistic",
            &[(cell, 12.0, report), (cell, 3.0, Value::Null)],
        );
        assert!(
            text.contains("| 16 | on | 1000 | 812 | 40 / 90 / 120 | 300 | 3.00 / 0.50 | 7.50 / 0.50 | 3.50 | 1.25 | 22.0 | 12 |"),
            "{text}"
        );
        assert!(text.contains("| - (incomplete) |"), "{text}");
    }
}
