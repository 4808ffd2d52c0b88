//! The images the node runs, built by the README's command, `scripts/build-images` (the
//! cert-syncer, mini-apiserver, kube-apiserver, kube-controller-manager, kube-scheduler and
//! pause images, from the workspace and the envtest/node assets, with no registry pull), and
//! imported into a node's containerd with the script's `--containerd SOCKET`.
//!
//! One podman storage serves every test of a run (`$TMPDIR/cert-reload-node-images/storage`,
//! under a file lock; podman wants its runroot path under 50 characters): the script's podman
//! layers are cached there, so the first node tier test builds and the others only import.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use super::containerd::Containerd;

/// Every image the script builds, as the pod manifests name them.
pub const IMAGES: [&str; 6] = [
    "localhost/cert-reload/cert-syncer:latest",
    "localhost/cert-reload/mini-apiserver:latest",
    "localhost/cert-reload/kube-apiserver:v1.20.2",
    "localhost/cert-reload/kube-controller-manager:v1.20.2",
    "localhost/cert-reload/kube-scheduler:v1.20.2",
    super::containerd::PAUSE_IMAGE,
];

/// The peer's image (OpenShift's operator binary, `manifests/static-pod-openshift-peer`), built
/// by the script when `../shared/openshift` is there.
pub const OPENSHIFT_SIDECARS_IMAGE: &str = "localhost/cert-reload/openshift-sidecars:c813e820bb94";

/// The cargo profile the images' binaries are built with: `E2E_NODE_IMAGE_PROFILE` (`release`
/// or `dev`), default `dev` (reuses the tests' `target/debug`). The peer figures are measured
/// with `release`, the build a user ships.
pub fn profile() -> String {
    std::env::var("E2E_NODE_IMAGE_PROFILE").unwrap_or_else(|_| "dev".to_owned())
}

/// The README's image command.
pub fn script() -> PathBuf {
    crate::envtest::repo_root().join("scripts/build-images")
}

/// Runs `scripts/build-images --profile dev|release ([`profile`]) --containerd SOCKET --storage
/// $TMPDIR/cert-reload-node-images/storage` (the README's command) for `containerd`, holding
/// the lock file beside it, and checks
/// that every image of [`IMAGES`] is there.
///
/// # Panics
/// When the script is missing or fails (with its output), or an image is missing after it.
pub fn build_and_import(containerd: &Containerd) {
    let (storage, lock) = shared_storage();
    let started = Instant::now();
    let script = script();
    assert!(
        script.is_file(),
        "{} is missing: the node tier runs the README's image command",
        script.display()
    );
    let out = Command::new(&script)
        .args(["--profile", &profile()])
        .arg("--containerd")
        .arg(containerd.socket())
        .arg("--storage")
        .arg(storage)
        .current_dir(crate::envtest::repo_root())
        // The script looks for `<repo>/../shared/*/setup`, absent beside a worktree: the
        // assets this process found.
        .env(
            "KUBEBUILDER_ASSETS",
            crate::envtest::assets().unwrap_or_else(|reason| panic!("{reason}")),
        )
        .env(
            "NODE_ASSETS",
            super::inputs::assets().unwrap_or_else(|reason| panic!("{reason}")),
        )
        .env(
            "OPENSHIFT_ASSETS",
            // The operator binary's directory, unpacked by `../shared/openshift/setup` (the
            // peer's image is skipped by the script without it).
            super::inputs::openshift_dir()
                .ok()
                .and_then(|dir| {
                    let out = Command::new(dir.join("setup")).output().ok()?;
                    out.status
                        .success()
                        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
                })
                .unwrap_or_default(),
        )
        .output()
        .expect("scripts/build-images runs");
    assert!(
        out.status.success(),
        "{} failed ({}):\n{}\n{}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    drop(lock);
    let present = containerd.images();
    let missing: Vec<&str> = IMAGES
        .iter()
        .copied()
        .filter(|image| !present.iter().any(|p| p == image))
        .collect();
    assert!(
        missing.is_empty(),
        "after scripts/build-images, containerd lacks {missing:?} (has {present:?})"
    );
    eprintln!(
        "images built and imported by scripts/build-images in {} ms",
        started.elapsed().as_millis()
    );
}

/// The podman storage every node test shares, `$TMPDIR/cert-reload-node-images/storage` (the
/// script's `--storage`: `root/`, `runroot/`), and its lock, held until the file is dropped.
/// podman refuses a runroot path over 50 characters: a short directory in the temp dir, one per
/// machine; the layers in it are cached by content.
///
/// # Panics
/// When the directory cannot be made or locked.
pub fn shared_storage() -> (PathBuf, std::fs::File) {
    let work = std::env::temp_dir().join("cert-reload-node-images");
    std::fs::create_dir_all(&work).expect("the images' work directory");
    let lock = std::fs::File::create(work.join("images.lock")).expect("the images lock");
    lock.lock().expect("lock the images' storage");
    (work.join("storage"), lock)
}

/// Builds the pause image alone the way `../shared/node/README.md` does (`FROM scratch`,
/// Kubernetes' static `pause`), saves it as an OCI archive in `dir` and returns its path: for the
/// smoke test, which needs no other image.
///
/// # Panics
/// When podman fails.
pub fn pause_archive(dir: &Path) -> PathBuf {
    let assets = super::inputs::assets().unwrap_or_else(|reason| panic!("{reason}"));
    let context = dir.join("pause-image");
    std::fs::create_dir_all(&context).expect("the pause build context");
    std::fs::copy(assets.join("pause"), context.join("pause")).expect("copy pause");
    std::fs::write(
        context.join("Containerfile"),
        "FROM scratch\nCOPY pause /pause\nENTRYPOINT [\"/pause\"]\n",
    )
    .expect("the pause Containerfile");
    let storage = dir.join("podman");
    let podman = |args: &[&str]| {
        let out = Command::new("podman")
            .args(["--storage-driver", "vfs", "--root"])
            .arg(storage.join("root"))
            .arg("--runroot")
            .arg(storage.join("run"))
            .args(args)
            .output()
            .expect("podman runs");
        assert!(
            out.status.success(),
            "podman {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let context_arg = context.display().to_string();
    podman(&["build", "-t", super::containerd::PAUSE_IMAGE, &context_arg]);
    let archive = dir.join("pause.tar");
    podman(&[
        "save",
        "--format",
        "oci-archive",
        "-o",
        &archive.display().to_string(),
        super::containerd::PAUSE_IMAGE,
    ]);
    archive
}
