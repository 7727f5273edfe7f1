//! Opt-in RBAC: a ServiceAccount's requests are checked against the stored Roles,
//! ClusterRoles and bindings; the admin client stays unrestricted.

mod common;

use common::api_error;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube_client::api::{Api, ListParams, PostParams};
use kube_sim::KubeSim;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const USER: &str = "system:serviceaccount:default:provisioner";

fn object<T: DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).unwrap()
}

async fn create<K>(sim: &KubeSim, value: Value)
where
    K: kube_client::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(sim.client(), "default");
    api.create(&PostParams::default(), &object(value))
        .await
        .unwrap();
}

fn config_map(name: &str) -> ConfigMap {
    object(json!({"metadata": {"name": name}, "data": {"k": "v"}}))
}

async fn sim_with_journal_role() -> KubeSim {
    let sim = KubeSim::builder().rbac(true).start().await.unwrap();
    let admin: Api<ConfigMap> = Api::namespaced(sim.client(), "default");
    for name in ["journal", "settings"] {
        admin
            .create(&PostParams::default(), &config_map(name))
            .await
            .unwrap();
    }
    create::<Role>(
        &sim,
        json!({"metadata": {"name": "journal"}, "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "update"],
             "resourceNames": ["journal"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}]}),
    )
    .await;
    create::<RoleBinding>(
        &sim,
        json!({"metadata": {"name": "journal"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "journal"},
               "subjects": [{"kind": "ServiceAccount", "name": "provisioner", "namespace": "default"}]}),
    )
    .await;
    sim
}

#[tokio::test]
async fn a_service_account_may_do_what_its_role_names_and_nothing_else() {
    let sim = sim_with_journal_role().await;
    let client = sim
        .service_account_client("default", "provisioner")
        .unwrap();
    let maps: Api<ConfigMap> = Api::default_namespaced(client.clone());

    let mut journal = maps.get("journal").await.unwrap();
    journal.data = Some([("k".to_owned(), "w".to_owned())].into());
    maps.replace("journal", &PostParams::default(), &journal)
        .await
        .unwrap();
    maps.create(&PostParams::default(), &config_map("new"))
        .await
        .unwrap();

    let (code, reason, message) = api_error(maps.get("settings").await);
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        format!(
            "configmaps \"settings\" is forbidden: User \"{USER}\" cannot get resource \
             \"configmaps\" in API group \"\" in the namespace \"default\""
        )
    );
    let mut settings = sim_admin_get(&sim, "settings").await;
    settings.data = Some([("k".to_owned(), "changed".to_owned())].into());
    let (code, _, message) = api_error(
        maps.replace("settings", &PostParams::default(), &settings)
            .await,
    );
    assert_eq!(code, 403);
    assert!(
        message.contains("cannot update resource \"configmaps\""),
        "{message}"
    );
    assert_eq!(
        api_error(maps.delete("journal", &Default::default()).await).0,
        403
    );
    let (code, _, message) = api_error(maps.list(&ListParams::default()).await);
    assert_eq!(code, 403);
    assert_eq!(
        message,
        format!(
            "configmaps is forbidden: User \"{USER}\" cannot list resource \"configmaps\" in \
             API group \"\" in the namespace \"default\""
        )
    );
    // The Role is in `default` only.
    let elsewhere: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    assert_eq!(api_error(elsewhere.get("journal").await).0, 403);
    let pvs: Api<PersistentVolume> = Api::all(client);
    let (code, _, message) = api_error(pvs.list(&ListParams::default()).await);
    assert_eq!(code, 403);
    assert!(message.ends_with("at the cluster scope"), "{message}");

    // The admin client is not restricted, and nothing forbidden was written.
    assert_eq!(
        sim_admin_get(&sim, "settings").await.data.unwrap()["k"],
        "v"
    );
    let denied: Vec<_> = sim
        .requests()
        .into_iter()
        .filter(|r| r.status == 403)
        .map(|r| r.verb)
        .collect();
    assert_eq!(denied, ["get", "update", "delete", "list", "get", "list"]);
    // The log names who asked: the ServiceAccount, or nobody for the admin client.
    let users: std::collections::BTreeSet<_> = sim.requests().into_iter().map(|r| r.user).collect();
    assert_eq!(users, [None, Some(USER.to_owned())].into());
}

async fn sim_admin_get(sim: &KubeSim, name: &str) -> ConfigMap {
    Api::<ConfigMap>::namespaced(sim.client(), "default")
        .get(name)
        .await
        .unwrap()
}

#[tokio::test]
async fn cluster_roles_apply_through_both_kinds_of_binding_and_groups() {
    let sim = KubeSim::builder().rbac(true).start().await.unwrap();
    let admin = sim.client();
    Api::<ClusterRole>::all(admin.clone())
        .create(
            &PostParams::default(),
            &object(json!({"metadata": {"name": "pv-reader"}, "rules": [
                {"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["list", "watch"]},
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"],
                 "resourceNames": ["settings"]},
                {"apiGroups": [""], "resources": ["persistentvolumeclaims/status"], "verbs": ["update"]}]})),
        )
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(
            &PostParams::default(),
            &object(json!({"metadata": {"name": "pv-reader"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "pv-reader"},
                "subjects": [{"kind": "Group", "name": "system:serviceaccounts:default"}]})),
        )
        .await
        .unwrap();
    let client = sim.service_account_client("default", "anyone").unwrap();
    Api::<PersistentVolume>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    // A list by name is authorized for that name.
    let maps: Api<ConfigMap> = Api::default_namespaced(client.clone());
    maps.list(&ListParams::default().fields("metadata.name=settings"))
        .await
        .unwrap();
    assert_eq!(api_error(maps.list(&ListParams::default()).await).0, 403);
    let other = sim.service_account_client("kube-system", "anyone").unwrap();
    assert_eq!(
        api_error(
            Api::<PersistentVolume>::all(other)
                .list(&ListParams::default())
                .await
        )
        .0,
        403
    );
}

#[tokio::test]
async fn an_unknown_token_is_unauthorized_and_rbac_off_checks_nothing() {
    let sim = KubeSim::builder().rbac(true).start().await.unwrap();
    let mut config = sim.service_account_config("default", "provisioner");
    config.auth_info.token = Some("guessed".to_owned().into());
    let guessed = kube_client::Client::try_from(config).unwrap();
    let (code, reason, _) = api_error(
        Api::<ConfigMap>::default_namespaced(guessed)
            .list(&ListParams::default())
            .await,
    );
    assert_eq!((code, reason.as_str()), (401, "Unauthorized"));

    let open = KubeSim::start().await.unwrap();
    let client = open
        .service_account_client("default", "provisioner")
        .unwrap();
    Api::<ConfigMap>::default_namespaced(client)
        .create(&PostParams::default(), &config_map("free"))
        .await
        .unwrap();
}
