//! `--audit-log FILE`: one JSON line per authenticated request on objects, holding what
//! kube-apiserver's authorizer sees (user, verb, API group, resource, namespace, name) and the
//! response code. Tests read it to check that RBAC rules cover every request a client really
//! makes, not only the ones its authors remember.
//!
//! ```json
//! {"user":"cert-syncer","verb":"watch","apiGroup":"","resource":"secrets","namespace":"ns","name":"serving-cert","code":200}
//! ```
//!
//! `name` follows kube-apiserver's `RequestInfo`: the name in the path, or for list and watch
//! the value of a `metadata.name=` field selector (which is how an RBAC rule with
//! `resourceNames` can allow a single-object list and watch). A create has none: its name is in
//! the body, and RBAC cannot restrict creates by name. Bodies, tokens and other query
//! parameters never reach the log. Requests that fail authentication or name no resource are
//! not logged.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One request, as the authorizer sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The authenticated user.
    pub user: String,
    /// `get`, `list`, `watch`, `create`, `update`, `patch` or `delete`.
    pub verb: String,
    /// The API group (`""` for core).
    pub api_group: String,
    /// The resource plural.
    pub resource: String,
    /// The namespace in the path; absent for cluster-wide list and watch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The object name (see the module docs), if the request names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The HTTP status of the response (a watch: the status its stream started with).
    pub code: u16,
}

/// The open log. Lines are written whole, one `write` each, under a lock.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<std::fs::File>,
}

impl AuditLog {
    /// Opens `path` for appending (created 0600 if missing).
    ///
    /// # Errors
    /// When the file cannot be opened; the message names it.
    pub fn open(path: &Path) -> anyhow::Result<AuditLog> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|err| anyhow::anyhow!("cannot open audit log {}: {err}", path.display()))?;
        Ok(AuditLog {
            path: path.to_owned(),
            file: Mutex::new(file),
        })
    }

    /// Appends one line. A failed write is logged, never fatal: the log is a debugging aid.
    pub fn record(&self, record: &Record) {
        let mut line = serde_json::to_vec(record).unwrap_or_default();
        line.push(b'\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(err) = file.write_all(&line) {
            tracing::warn!(path = %self.path.display(), error = %err, "cannot write the audit log");
        }
    }
}

/// Reads an audit log written by [`AuditLog`].
///
/// # Errors
/// An unreadable file, or a line that is not a [`Record`] (by number).
pub fn read(path: &Path) -> anyhow::Result<Vec<Record>> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| anyhow::anyhow!("cannot read audit log {}: {err}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| {
            serde_json::from_str(line).map_err(|err| {
                anyhow::anyhow!("audit log {} line {}: {err}", path.display(), index + 1)
            })
        })
        .collect()
}

/// The name a list or watch asks for through its field selector (`metadata.name=NAME` or
/// `metadata.name==NAME`, alone or among other terms), as kube-apiserver's `RequestInfo`
/// takes it.
pub fn name_from_field_selector(selector: Option<&str>) -> Option<String> {
    selector?.split(',').find_map(|term| {
        let rest = term.trim().strip_prefix("metadata.name")?.trim_start();
        let value = rest.strip_prefix("==").or_else(|| rest.strip_prefix('='))?;
        let value = value.trim();
        (!value.is_empty()).then(|| value.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_selectors_name_the_object_like_request_info() {
        assert_eq!(
            name_from_field_selector(Some("metadata.name=serving-cert")).as_deref(),
            Some("serving-cert")
        );
        assert_eq!(
            name_from_field_selector(Some("metadata.namespace=ns,metadata.name==a")).as_deref(),
            Some("a")
        );
        assert_eq!(name_from_field_selector(Some("metadata.name!=a")), None);
        assert_eq!(
            name_from_field_selector(Some("metadata.namespace=ns")),
            None
        );
        assert_eq!(name_from_field_selector(None), None);
    }

    #[test]
    fn records_round_trip_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path).unwrap();
        let record = Record {
            user: "u".into(),
            verb: "watch".into(),
            api_group: String::new(),
            resource: "secrets".into(),
            namespace: Some("ns".into()),
            name: Some("a".into()),
            code: 200,
        };
        log.record(&record);
        log.record(&Record {
            namespace: None,
            name: None,
            ..record.clone()
        });
        let records = read(&path).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0], record);
        assert_eq!(records[1].namespace, None);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
