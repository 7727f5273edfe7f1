//! The kubeconfig file that points `kubectl` (and any client) at the sim.

/// A kubeconfig (YAML) with one cluster, user and context, all named `kube-sim`, no auth,
/// and `default` as the context's namespace.
pub(crate) fn render(url: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: kube-sim
  cluster:
    server: {url}
users:
- name: kube-sim
  user: {{}}
contexts:
- name: kube-sim
  context:
    cluster: kube-sim
    user: kube-sim
    namespace: default
current-context: kube-sim
preferences: {{}}
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_names_the_server_and_current_context() {
        let text = render("http://127.0.0.1:1234");
        assert!(text.contains("server: http://127.0.0.1:1234\n"));
        assert!(text.contains("current-context: kube-sim\n"));
    }
}
