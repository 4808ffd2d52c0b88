//! The nodes' files on the machine: each node's root a copy of the slept template (with its own
//! kubelet identity), bound into its mount namespace; the helpers that copy and empty them.

use std::path::Path;
use std::process::Command;

use testkit::pki::{Ca, CertSpec};

use super::namespaces::{NODE_PATHS, Network};
use crate::node::kcm_plane::KcmPlane;
use crate::process::run_checked;

/// The kubelet's client certificate file as the sleep left it (the name `kcm_plane` gives it).
pub(super) const SLEPT_IDENTITY: &str =
    "var/lib/kubelet/pki/kubelet-client-2015-01-01-00-00-00.pem";

/// The kubelet's `--cert-dir` on every node, as the node sees it.
pub const KUBELET_CERT_DIR: &str = "/var/lib/kubelet/pki";

/// The link the kubelet reads its client certificate through.
const CURRENT: &str = "var/lib/kubelet/pki/kubelet-client-current.pem";

/// The slept `csr-signer` (its files in the controller manager's cert dir).
pub(super) fn slept_csr_signer(kcm: &KcmPlane) -> Ca {
    let read = |key: &str| {
        std::fs::read_to_string(kcm.cert_file(&format!("secrets/csr-signer/{key}")))
            .expect("the synced csr-signer")
    };
    Ca::from_pems(&read("tls.crt"), &read("tls.key"))
}

/// Copies the template to the node's root and re-issues its kubelet's expired identity for
/// `name`.
pub(super) fn copy_template(template: &Path, root: &Path, signer: &Ca, name: &str) {
    std::fs::create_dir_all(root).expect("the node's root");
    copy_contents(template, root);
    for path in NODE_PATHS {
        std::fs::create_dir_all(root.join(path.trim_start_matches('/'))).expect("a node path");
    }
    // As the sleep left it: from the old csr-signer, expired with it (one hour inside its
    // window, as `kcm_plane` makes node 0's).
    let der = crate::node::scenario::first_der(&signer.cert_pem);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("the csr-signer");
    let at = |t: x509_parser::time::ASN1Time| {
        time::OffsetDateTime::from_unix_timestamp(t.timestamp()).expect("a time")
    };
    let identity = signer.issue(
        &CertSpec::client(&format!("system:node:{name}"))
            .organization("system:nodes")
            .valid(
                at(cert.validity().not_before) + time::Duration::hours(1),
                at(cert.validity().not_after) - time::Duration::hours(1),
            ),
    );
    testkit::rename::rename_into_with_mode(
        &root.join(SLEPT_IDENTITY),
        format!("{}{}", identity.cert_pem, identity.key_pem).as_bytes(),
        0o600,
    );
    // The link as the kubelet writes it with `--cert-dir=/var/lib/kubelet/pki`: absolute, the
    // node's own path (the template's link names the template's path, which no container has).
    let current = root.join(CURRENT);
    std::fs::remove_file(&current).expect("the slept kubelet-client-current.pem");
    std::os::unix::fs::symlink(Path::new("/").join(SLEPT_IDENTITY), &current)
        .expect("kubelet-client-current.pem");
}

/// Binds the node's root (at the template's path), `/etc/kubernetes`, `/var/lib/kubelet` and
/// `/var/log` in its mount namespace (recursively: a tmpfs mounted below comes along).
pub(super) fn bind_node_paths(network: &Network, index: usize, template: &Path, root: &Path) {
    network
        .bind(index, root, template)
        .unwrap_or_else(|err| panic!("{err}"));
    for path in NODE_PATHS {
        let source = root.join(path.trim_start_matches('/'));
        network
            .bind(index, &source, Path::new(path))
            .unwrap_or_else(|err| panic!("{err}"));
    }
}

/// `cp -a FROM/. TO` (modes, owners, links kept).
pub(super) fn copy_contents(from: &Path, to: &Path) {
    run_checked(
        Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", from.display()))
            .arg(to),
        &format!("cp -a {} {}", from.display(), to.display()),
    );
}

/// Removes everything inside `dir`, keeping `dir` itself (a mount point, or bound elsewhere).
pub(super) fn empty(dir: &Path) {
    for entry in std::fs::read_dir(dir)
        .unwrap_or_else(|err| panic!("{}: {err}", dir.display()))
        .filter_map(Result::ok)
    {
        let path = entry.path();
        let removed = if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    }
}

/// Mounts a tmpfs of `size` bytes on `dir` (on the machine: the node's bind takes it along),
/// with what `dir` held copied in.
pub(super) fn mount_tmpfs_keeping(dir: &Path, size: u64) {
    let aside = dir.with_extension("before-tmpfs");
    std::fs::rename(dir, &aside).expect("the cert dir moved aside");
    std::fs::create_dir_all(dir).expect("the mount point");
    run_checked(
        Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size},mode=0755"))
            .arg("cert-dir")
            .arg(dir),
        "mount the cert dir's tmpfs",
    );
    copy_contents(&aside, dir);
    std::fs::remove_dir_all(&aside).expect("the cert dir's old copy");
}
