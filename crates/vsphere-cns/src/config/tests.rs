use super::*;

const GOOD: &str = r#"
; csi-vsphere.conf as vsphere-csi-driver documents it
[Global]
cluster-id = "demo-cluster"
cluster-distribution = "OpenShift"
user = "global-user"
password = "global-pass"
port = "8443"

[VirtualCenter "vc1.example.com"]
user = "administrator@vsphere.local"
password = "p;a#s\"s"
port = "443"
datacenters = "dc-1, dc-2,,"
thumbprint = "AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89"

[VirtualCenter "vc2.example.com"]
insecure-flag = "true"

[Labels]
region = k8s-region
zone = k8s-zone
"#;

#[test]
fn parses_a_complete_file_with_global_defaults() {
    let config = VsphereConfig::parse(GOOD).unwrap();
    assert_eq!(config.global.cluster_id, "demo-cluster");
    assert_eq!(
        config.global.cluster_distribution.as_deref(),
        Some("OpenShift")
    );
    assert_eq!(config.global.supervisor_id, None);
    assert_eq!(config.virtual_centers.len(), 2);

    let vc1 = &config.virtual_centers[0];
    assert_eq!(vc1.host, "vc1.example.com");
    assert_eq!(vc1.user, "administrator@vsphere.local");
    assert_eq!(vc1.password.expose(), "p;a#s\"s");
    assert_eq!(vc1.port, 443);
    assert_eq!(vc1.datacenters, ["dc-1", "dc-2"]);
    assert!(matches!(vc1.tls, TlsMode::Thumbprint(_)));

    let vc2 = &config.virtual_centers[1];
    assert_eq!(vc2.user, "global-user");
    assert_eq!(vc2.password.expose(), "global-pass");
    assert_eq!(vc2.port, 8443);
    assert_eq!(vc2.tls, TlsMode::Insecure);
    assert_eq!(
        config.labels.get("zone").map(String::as_str),
        Some("k8s-zone")
    );
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

#[test]
fn vc_config_carries_host_port_credentials_and_tls() {
    let config = VsphereConfig::parse(GOOD).unwrap();
    let vc = &config.virtual_centers[1];
    assert_eq!(vc.base_url(), "https://vc2.example.com:8443");
    assert_eq!(vc.user, "global-user");
    assert_eq!(vc.tls, TlsMode::Insecure);
}

#[test]
fn minimal_file_defaults_port_443_and_verified_tls() {
    let config = VsphereConfig::parse("[VirtualCenter \"vc\"]\nuser = u\npassword = p\n").unwrap();
    let vc = &config.virtual_centers[0];
    assert_eq!(vc.port, 443);
    assert_eq!(vc.tls, TlsMode::Verified);
    assert_eq!(config.global.cluster_id, "");
}

#[test]
fn ca_file_and_bare_boolean_keys() {
    let text =
        "[Global]\nca-file = /etc/ssl/vc.pem\n[VirtualCenter \"vc\"]\nuser = u\npassword = p\n";
    let vc = &VsphereConfig::parse(text).unwrap().virtual_centers[0];
    assert_eq!(vc.tls, TlsMode::CaFile("/etc/ssl/vc.pem".into()));
    let text = "[VirtualCenter \"vc\"]\nuser = u\npassword = p\ninsecure-flag\n";
    let vc = &VsphereConfig::parse(text).unwrap().virtual_centers[0];
    assert_eq!(vc.tls, TlsMode::Insecure);
}

#[test]
fn unknown_keys_and_sections_are_warnings_like_gcfg_fatal_only() {
    let text = "[Global]\nquery-limit = 100\n[Workspace]\nserver = x\n[VirtualCenter \"vc\"]\nuser = u\npassword = p\ntargetvSANFileShareDatastoreURLs = x\n";
    let config = VsphereConfig::parse(text).unwrap();
    assert_eq!(config.warnings.len(), 3, "{:?}", config.warnings);
    assert!(config.warnings[0].contains("csi-vsphere.conf:3: unknown section [Workspace]"));
    assert!(
        config
            .warnings
            .iter()
            .any(|w| w.contains(":2: [Global] query-limit: unknown key"))
    );
}

#[test]
fn bad_files_are_rejected_with_file_line_section_and_key() {
    let vc = "[VirtualCenter \"vc1\"]\nuser = u\npassword = p\n";
    let cases: &[(&str, String, &str)] = &[
        (
            "missing VirtualCenter",
            "[Global]\ncluster-id = c\n".into(),
            "csi-vsphere.conf: no [VirtualCenter \"host\"] section",
        ),
        (
            "missing user",
            "[VirtualCenter \"vc1\"]\npassword = p\n".into(),
            "csi-vsphere.conf:1: [VirtualCenter \"vc1\"] user: missing (set user here or in [Global])",
        ),
        (
            "missing password",
            "\n[VirtualCenter \"vc1\"]\nuser = u\n".into(),
            "csi-vsphere.conf:2: [VirtualCenter \"vc1\"] password: missing",
        ),
        (
            "bad port",
            format!("{vc}\n\n\nport = \"abc\"\n"),
            "csi-vsphere.conf:7: [VirtualCenter \"vc1\"] port: the value is not a port number",
        ),
        (
            "port zero",
            format!("{vc}port = 0\n"),
            "csi-vsphere.conf:4: [VirtualCenter \"vc1\"] port: the value is not a port number",
        ),
        (
            "port too big",
            format!("[Global]\nport = 70000\n{vc}"),
            "csi-vsphere.conf:2: [Global] port: the value is not a port number",
        ),
        (
            "bad bool",
            format!("{vc}insecure-flag = maybe\n"),
            "csi-vsphere.conf:4: [VirtualCenter \"vc1\"] insecure-flag: the value is not a boolean",
        ),
        (
            "bad thumbprint",
            format!("{vc}thumbprint = AB:CD\n"),
            "csi-vsphere.conf:4: [VirtualCenter \"vc1\"] thumbprint: the value is not a SHA-256",
        ),
        (
            "duplicate section",
            format!("{vc}{vc}"),
            "csi-vsphere.conf:4: section [VirtualCenter \"vc1\"] appears twice (first at line 1)",
        ),
        (
            "duplicate global",
            format!("[Global]\n[Global]\n{vc}"),
            "csi-vsphere.conf:2: section [Global] appears twice (first at line 1)",
        ),
        (
            "duplicate key",
            format!("{vc}user = other\n"),
            "csi-vsphere.conf:4: [VirtualCenter \"vc1\"] user: set twice (first at line 2)",
        ),
        (
            "unterminated quote",
            format!("{vc}datacenters = \"dc-1\n"),
            "csi-vsphere.conf:4: [VirtualCenter \"vc1\"] datacenters: unterminated quote in value",
        ),
        (
            "unterminated section quote",
            "[VirtualCenter \"vc1]\n".into(),
            "csi-vsphere.conf:1: unterminated quote in section",
        ),
        (
            "host missing",
            "[VirtualCenter]\nuser = u\n".into(),
            "csi-vsphere.conf:1: [VirtualCenter] needs a host name",
        ),
        (
            "key outside section",
            format!("user = u\n{vc}"),
            "csi-vsphere.conf:1: user: key outside of any section",
        ),
        (
            "cluster id too long",
            format!("[Global]\ncluster-id = {}\n{vc}", "c".repeat(65)),
            "csi-vsphere.conf:2: [Global] cluster-id: must not exceed 64 characters",
        ),
        (
            "garbage line",
            format!("{vc}this is not ini\n"),
            "csi-vsphere.conf:4: [VirtualCenter \"vc1\"] this: expected name = value",
        ),
        (
            "unterminated password names section and key, not the value",
            "[VirtualCenter \"vc1\"]\nuser = u\npassword = \"s3cret\n".into(),
            "csi-vsphere.conf:3: [VirtualCenter \"vc1\"] password: unterminated quote in value",
        ),
        (
            "password without = is not echoed",
            "[VirtualCenter \"vc1\"]\nuser = u\npassword: s3cret\n".into(),
            "csi-vsphere.conf:3: [VirtualCenter \"vc1\"] password: expected name = value",
        ),
    ];
    for (name, text, expected) in cases {
        let err = VsphereConfig::parse(text).expect_err(name).to_string();
        assert!(!err.contains("s3cret"), "{name}: {err}");
        assert!(
            err.starts_with(expected),
            "{name}: got {err:?}, want prefix {expected:?}"
        );
    }
}

#[test]
fn errors_never_contain_the_password() {
    let text = "[VirtualCenter \"vc1\"]\nuser = u\npassword = hunter2\nport = x\n";
    let err = VsphereConfig::parse(text).unwrap_err().to_string();
    assert!(!err.contains("hunter2"), "{err}");
    let config =
        VsphereConfig::parse("[VirtualCenter \"vc1\"]\nuser = u\npassword = hunter2\n").unwrap();
    assert!(!format!("{config:?}").contains("hunter2"));
}

#[test]
fn load_names_the_path_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vsphere.conf");
    std::fs::write(
        &path,
        "[VirtualCenter \"vc1\"]\nuser = u\npassword = p\nport = abc\n",
    )
    .unwrap();
    let err = VsphereConfig::load(&path).unwrap_err().to_string();
    assert!(err.starts_with(&format!("{}:4: ", path.display())), "{err}");
    let missing = VsphereConfig::load(dir.path().join("nope.conf")).unwrap_err();
    assert!(matches!(missing, ConfigError::Io { .. }));
}

const THUMB: &str = "AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89";

fn vc_of(text: &str) -> VirtualCenterConfig {
    VsphereConfig::parse(text)
        .unwrap_or_else(|e| panic!("{e}"))
        .virtual_centers
        .remove(0)
}

#[test]
fn a_sections_certificate_settings_win_over_global_insecure_flag() {
    let global = "[Global]\ninsecure-flag = true\nuser = u\npassword = p\n";
    // The section's thumbprint, its ca-file and its explicit insecure-flag = false each win.
    let vc = vc_of(&format!(
        "{global}[VirtualCenter \"vc\"]\nthumbprint = {THUMB}\n"
    ));
    assert!(matches!(vc.tls, TlsMode::Thumbprint(_)), "{:?}", vc.tls);
    let vc = vc_of(&format!(
        "{global}[VirtualCenter \"vc\"]\nca-file = /etc/vc.pem\n"
    ));
    assert_eq!(vc.tls, TlsMode::CaFile("/etc/vc.pem".into()));
    let vc = vc_of(&format!(
        "{global}[VirtualCenter \"vc\"]\ninsecure-flag = false\n"
    ));
    assert_eq!(vc.tls, TlsMode::Verified);
    // A section that sets none of the three inherits all of them.
    let vc = vc_of(&format!("{global}[VirtualCenter \"vc\"]\n"));
    assert_eq!(vc.tls, TlsMode::Insecure);
    // And the other way round: a section's insecure-flag is not mixed with Global's pin.
    let text = format!(
        "[Global]\nthumbprint = {THUMB}\nuser = u\npassword = p\n[VirtualCenter \"vc\"]\ninsecure-flag = true\n"
    );
    assert_eq!(vc_of(&text).tls, TlsMode::Insecure);
}

#[test]
fn insecure_together_with_a_thumbprint_or_ca_file_is_an_error_naming_file_and_section() {
    let vc = "[VirtualCenter \"vc1\"]\nuser = u\npassword = p\n";
    for (name, text, expected) in [
        (
            "section thumbprint",
            format!("{vc}insecure-flag = true\nthumbprint = {THUMB}\n"),
            "csi-vsphere.conf:4: [VirtualCenter \"vc1\"] insecure-flag: insecure-flag = true together with thumbprint:",
        ),
        (
            "section ca-file",
            format!("{vc}ca-file = /etc/vc.pem\ninsecure-flag\n"),
            "csi-vsphere.conf:5: [VirtualCenter \"vc1\"] insecure-flag: insecure-flag = true together with ca-file:",
        ),
        (
            "inherited from Global",
            format!(
                "[Global]\ninsecure-flag = 1\nca-file = /etc/vc.pem\nthumbprint = {THUMB}\n{vc}"
            ),
            "csi-vsphere.conf:2: [Global] insecure-flag: insecure-flag = true together with thumbprint and ca-file (inherited by [VirtualCenter \"vc1\"]",
        ),
    ] {
        let err = VsphereConfig::parse(&text).expect_err(name).to_string();
        assert!(err.starts_with(expected), "{name}: {err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vsphere.conf");
    std::fs::write(
        &path,
        format!("{vc}insecure-flag = true\nthumbprint = {THUMB}\n"),
    )
    .unwrap();
    let err = VsphereConfig::load(&path).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("{}:4: [VirtualCenter \"vc1\"]", path.display())),
        "{err}"
    );
}

#[cfg(unix)]
#[test]
fn a_file_readable_by_group_or_others_gets_a_warning() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vsphere.conf");
    std::fs::write(&path, "[VirtualCenter \"vc1\"]\nuser = u\npassword = p\n").unwrap();
    for (mode, warned) in [
        (0o644, true),
        (0o640, true),
        (0o604, true),
        (0o600, false),
        (0o400, false),
    ] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let config = VsphereConfig::load(&path).unwrap();
        let warning = config
            .warnings
            .iter()
            .find(|w| w.contains("readable by group or others"));
        assert_eq!(
            warning.is_some(),
            warned,
            "mode {mode:o}: {:?}",
            config.warnings
        );
        if let Some(warning) = warning {
            assert!(
                warning.starts_with(&path.display().to_string()),
                "{warning}"
            );
            assert!(warning.contains(&format!("{mode:04o}")), "{warning}");
        }
    }
    // parse() has no file, so no permission warning.
    assert!(
        VsphereConfig::parse("[VirtualCenter \"vc1\"]\nuser = u\npassword = p\n")
            .unwrap()
            .warnings
            .is_empty()
    );
}

#[test]
fn no_error_echoes_any_part_of_a_bad_value() {
    // A password pasted into the wrong key (or a key that fails to parse) must not leak.
    let secret = "Pa55-w0rd_XYZ";
    let vc = "[VirtualCenter \"vc1\"]\nuser = u\npassword = p\n";
    let cases = [
        format!("{vc}port = {secret}\n"),
        format!("[Global]\nport = {secret}\n{vc}"),
        format!("{vc}insecure-flag = {secret}\n"),
        format!("[Global]\ninsecure-flag = {secret}\n{vc}"),
        format!("{vc}thumbprint = {secret}\n"),
        format!("{vc}thumbprint = {}\n", ["AB"; 20].join(":")),
        format!("{vc}datacenters = \"{secret}\\q\"\n"),
        format!("{vc}datacenters = {secret}\\"),
        format!("[Global]\ncluster-id = {}\n{vc}", secret.repeat(10)),
        format!("[Global] {secret}\n{vc}"),
        format!("{vc}password = \"{secret}\n"),
        format!("{vc}password: {secret}\n"),
        format!("{secret} = x\n{vc}"),
        format!("{vc}insecure-flag = true\nthumbprint = {THUMB}\npassword2 = {secret}\n"),
    ];
    for text in &cases {
        let err = VsphereConfig::parse(text).expect_err(text);
        let shown = format!("{err} {err:?}");
        // No piece of the value either (the old messages quoted one escape character).
        for piece in [secret, "Pa55", "XYZ", "\\q", "AB:AB"] {
            assert!(!shown.contains(piece), "{text:?} leaked {piece:?}: {shown}");
        }
    }
}
