//! The code a user copies from the READMEs is the code CI compiles and runs: the driver of
//! README.md and of provision-controller's README is `examples/my_driver.rs` verbatim
//! (whose tests run it against kube-sim and through the conformance suite), and no code
//! block stops on Ctrl-C alone (the kubelet sends SIGTERM).

use std::path::Path;

fn read(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The text of the fenced code block that follows the line `marker` in `markdown`.
fn block_after(markdown: &str, marker: &str) -> String {
    let (_, after) = markdown
        .split_once(marker)
        .unwrap_or_else(|| panic!("no {marker:?}"));
    let mut lines = after.lines().skip_while(|l| !l.starts_with("```"));
    let fence = lines.next().expect("a code block after the marker");
    assert!(
        fence.starts_with("```rust") || fence.starts_with("```toml"),
        "{fence}"
    );
    let mut text = String::new();
    for line in lines.take_while(|l| !l.starts_with("```")) {
        text.push_str(line);
        text.push('\n');
    }
    text
}

#[test]
fn the_readme_driver_is_the_example_verbatim() {
    let example = read("examples/my_driver.rs");
    let readme = read("README.md");
    let quoted = block_after(&readme, "<!-- out-of-workspace: src/main.rs");
    assert!(
        quoted == example,
        "README.md's src/main.rs differs from examples/my_driver.rs: copy the file into the block"
    );
    let crate_readme = read("crates/provision-controller/README.md");
    let quoted = block_after(&crate_readme, "<!-- verbatim examples/my_driver.rs -->");
    assert!(
        quoted == example,
        "crates/provision-controller/README.md's quick start differs from examples/my_driver.rs"
    );
}

/// docs/production.md's metrics recipe is `examples/metrics.rs`, which `cargo test` builds.
#[test]
fn the_metrics_recipe_is_the_example_verbatim() {
    let quoted = block_after(
        &read("docs/production.md"),
        "<!-- verbatim examples/metrics.rs -->",
    );
    assert!(
        quoted == read("examples/metrics.rs"),
        "docs/production.md's metrics recipe differs from examples/metrics.rs"
    );
}

/// A first run against a real (HTTPS) cluster works from the README: its client is
/// provision-controller's (TLS and HTTP/2 built in), so the user picks no TLS feature; the
/// binary picks the Kubernetes version.
#[test]
fn the_readme_dependencies_pick_a_kubernetes_version_and_need_no_tls_choice() {
    let toml = block_after(&read("README.md"), "<!-- out-of-workspace: Cargo.toml");
    let line = |name: &str| {
        toml.lines()
            .find(|l| l.starts_with(&format!("{name} = ")))
            .map(ToOwned::to_owned)
    };
    let k8s_openapi = line("k8s-openapi").expect("a k8s-openapi line");
    assert!(k8s_openapi.contains(r#""latest""#), "{k8s_openapi}");
    assert_eq!(line("kube-client"), None, "no TLS feature to choose");
    assert!(toml.contains(r#"features = ["testing"]"#));
    let example = read("examples/my_driver.rs");
    assert!(example.contains("provision_controller::client::infer()"));
    assert!(!example.contains("Client::try_from"));
}

#[test]
fn no_code_block_stops_on_ctrl_c_alone() {
    let mut files = vec![
        "README.md".to_owned(),
        "docs/production.md".to_owned(),
        "docs/testing.md".to_owned(),
    ];
    for krate in [
        "cnsmetadata",
        "kube-controller-kit",
        "kube-sim",
        "provision-controller",
        "vsphere-cns",
        "vsphere-controllers",
    ] {
        files.push(format!("crates/{krate}/README.md"));
    }
    for file in files {
        let text = read(&file);
        let mut in_code = false;
        for (number, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
            } else if in_code && line.contains("ctrl_c()") {
                panic!(
                    "{file}:{}: a shutdown on Ctrl-C alone; use shutdown_signal() (SIGTERM or SIGINT)",
                    number + 1
                );
            }
        }
    }
}
