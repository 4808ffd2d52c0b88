//! Go's reading of a CertificateSigningRequest, as the Go side prints it: `kubectl describe csr`
//! parses `spec.request` with Go's `pem.Decode` and `x509.ParseCertificateRequest` (the same
//! calls as kube-apiserver's validation and kube-controller-manager's signer) and prints the
//! subject's fields and the SANs it read. Debian's kubectl (the CI's, `kubernetes-client`
//! 1.20.2) is built with the same Go 1.19 as the envtest kube-apiserver; a newer kubectl's Go
//! reads these two calls the same way for the requests the approver accepts.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use crate::RealApiServer;

/// What Go read from one CSR's request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GoView {
    /// `cr.Subject.CommonName` (Go keeps the last CN).
    pub common_name: String,
    /// Every other subject field kubectl prints with a value (`Organization`, `Organizational
    /// Unit`, `Country`, `Serial Number`...), each with its values in order (Go appends every
    /// O).
    pub subject: BTreeMap<String, Vec<String>>,
    /// Every SAN (`DNS Names: n`, `IP Addresses: 10.0.0.1`...).
    pub sans: Vec<String>,
}

/// Why Go's view cannot be had here (no kubectl on `PATH`), or `None`.
pub fn skip_reason() -> Option<String> {
    match Command::new("kubectl")
        .args(["version", "--client"])
        .output()
    {
        Ok(out) if out.status.success() => None,
        _ => Some("kubectl is not installed: Go's reading of the CSRs is not compared".to_owned()),
    }
}

/// A kubeconfig for kubectl as the admin of `api` (SNI `localhost-recovery`, its CA).
pub fn kubeconfig(api: &RealApiServer) -> PathBuf {
    let path = api.dir.join("kubectl.kubeconfig");
    let config = format!(
        "apiVersion: v1\nkind: Config\n\
         clusters: [{{name: c, cluster: {{server: \"{}\", certificate-authority: \"{}\", tls-server-name: localhost-recovery}}}}]\n\
         users: [{{name: u, user: {{token: \"{}\"}}}}]\n\
         contexts: [{{name: x, context: {{cluster: c, user: u}}}}]\n\
         current-context: x\n",
        api.url(),
        api.dir.join("recovery-ca.crt").display(),
        api.token
    );
    std::fs::write(&path, config).expect("the kubectl kubeconfig");
    path
}

/// Go's view of each CSR of `names` (`kubectl describe csr NAME...`, one call), by name: `Err`
/// with kubectl's words when Go could not parse it.
///
/// # Panics
/// When kubectl cannot run.
pub fn describe(api: &RealApiServer, names: &[&str]) -> BTreeMap<String, Result<GoView, String>> {
    let config = kubeconfig(api);
    let mut views = BTreeMap::new();
    for chunk in names.chunks(50) {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&config)
            .args(["--request-timeout", "30s", "describe", "csr"])
            .args(chunk)
            .output()
            .expect("kubectl runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        for section in split_sections(&stdout) {
            if let Some((name, view)) = parse_section(&section) {
                views.insert(name, Ok(view));
            }
        }
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        for name in chunk {
            views
                .entry((*name).to_owned())
                .or_insert_with(|| Err(stderr.trim().to_owned()));
        }
    }
    views
}

/// The output's per-object sections, each starting at its `Name:` line.
fn split_sections(text: &str) -> Vec<String> {
    let mut sections: Vec<String> = Vec::new();
    for line in text.lines() {
        if line.starts_with("Name:") {
            sections.push(String::new());
        }
        if let Some(current) = sections.last_mut() {
            current.push_str(line);
            current.push('\n');
        }
    }
    sections
}

/// One object's section: its name and what Go read. The subject is the indented block under
/// `Subject:`, the SANs the one under `Subject Alternative Names:`; a list's further values are
/// on lines indented deeper than its field's.
fn parse_section(section: &str) -> Option<(String, GoView)> {
    let mut lines = section.lines();
    let name = lines.next()?.strip_prefix("Name:")?.trim().to_owned();
    let mut view = GoView::default();
    let mut block = "";
    let mut field_indent = usize::MAX;
    let mut field = String::new();
    for line in lines {
        let indent = line.len() - line.trim_start().len();
        if indent == 0 {
            block = match line.trim_end() {
                "Subject:" => "subject",
                "Subject Alternative Names:" => "sans",
                _ => "",
            };
            field_indent = usize::MAX;
            continue;
        }
        let value = if indent <= field_indent {
            let Some((name, value)) = line.trim().split_once(':') else {
                continue;
            };
            field_indent = indent;
            field = name.to_owned();
            value.trim()
        } else {
            line.trim()
        };
        if value.is_empty() {
            continue;
        }
        match block {
            "subject" if field == "Common Name" => view.common_name = value.to_owned(),
            "subject" => view
                .subject
                .entry(field.clone())
                .or_default()
                .push(value.to_owned()),
            "sans" => view.sans.push(format!("{field}: {value}")),
            _ => {}
        }
    }
    Some((name, view))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_describe_section_is_read_field_by_field() {
        let text = "Name:         a\nLabels:       <none>\nSubject:\n  Common Name:    system:node:n\n  Serial Number:  \n  Organization:   system:nodes\n                  system:masters\nSubject Alternative Names:\n         DNS Names:     n\n                        m\nEvents:  <none>\n\n\nName:         b\nSubject:\n  Common Name:  x\n";
        let sections = split_sections(text);
        assert_eq!(sections.len(), 2);
        let (name, view) = parse_section(&sections[0]).unwrap();
        assert_eq!(name, "a");
        assert_eq!(view.common_name, "system:node:n");
        assert_eq!(
            view.subject["Organization"],
            ["system:nodes", "system:masters"]
        );
        assert!(!view.subject.contains_key("Serial Number"));
        assert_eq!(view.sans, ["DNS Names: n", "DNS Names: m"]);
    }
}
