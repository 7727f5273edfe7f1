//! `pv-diff LEFT.json RIGHT.json`: the fields in which two runs' PVs differ, paired by
//! claim, names, uids, timestamps and the driver's volume ids aside (see
//! `integration_tests::pv_diff`). Exits 0 when nothing differs, 1 when something does, 2
//! on bad input.

use std::process::ExitCode;

use integration_tests::pv_diff::{by_claim, diff};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [left, right] = args.as_slice() else {
        eprintln!("usage: pv-diff LEFT.json RIGHT.json (each `kubectl get pv -o json`)");
        return ExitCode::from(2);
    };
    let read = |path: &String| {
        std::fs::read_to_string(path)
            .map_err(|e| format!("{path}: {e}"))
            .and_then(|text| by_claim(&text).map_err(|e| format!("{path}: {e}")))
    };
    let (l, r) = match (read(left), read(right)) {
        (Ok(l), Ok(r)) => (l, r),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("pv-diff: {e}");
            return ExitCode::from(2);
        }
    };
    let lines = diff(&l, &r);
    for line in &lines {
        println!("{line}");
    }
    eprintln!(
        "{} claims on the left, {} on the right, {} differences",
        l.len(),
        r.len(),
        lines.len()
    );
    if lines.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
