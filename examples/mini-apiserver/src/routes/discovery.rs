//! Discovery: `/version`, and the API versions, groups and resources this server serves.

use examples::serve::Body;
use http::Response;
use serde_json::{Value, json};

use super::body::json_ok;
use crate::resource::Resource;

pub(super) fn version() -> Response<Body> {
    json_ok(&json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-mini-apiserver",
        "platform": "linux/amd64", "goVersion": "n/a", "compiler": "rustc",
        "gitCommit": "", "gitTreeState": "clean", "buildDate": ""
    }))
}

pub(super) fn resource_list(group_version: &str) -> Value {
    let resources: Vec<Value> = Resource::ALL
        .into_iter()
        .filter(|r| r.api_version() == group_version)
        .map(|r| {
            let mut resource = json!({
                "name": r.plural(), "singularName": r.kind().to_ascii_lowercase(), "namespaced": true,
                "kind": r.kind(),
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
            });
            // As kube-apiserver lists them (`kubectl get cm`, `kubectl get ev`).
            let short_names: &[&str] = match r {
                Resource::ConfigMaps => &["cm"],
                Resource::Events => &["ev"],
                _ => &[],
            };
            if !short_names.is_empty() {
                resource["shortNames"] = json!(short_names);
            }
            resource
        })
        .collect();
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}

pub(super) fn group_json(group: &str) -> Value {
    let version = json!({"groupVersion": format!("{group}/v1"), "version": "v1"});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": [version.clone()], "preferredVersion": version})
}
