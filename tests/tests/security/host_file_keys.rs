//! A `sync --file` host file (0644, read by every user of the node) never receives a private
//! key: a Secret whose `tls.crt` also holds its `PRIVATE KEY` block is refused as node mode
//! refuses it, the last good file is kept, and the refusal is named (object, key,
//! resourceVersion) in the log, `/readyz`, the error count and a Warning Event; the next good
//! version is written again. On `mini-apiserver` and the real kube-apiserver.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use e2e::apiserver::ADMIN_TOKEN;
use e2e::syncer::{NS, tls_secret};
use e2e::{
    Backend, Ca, ChildProcess, Syncer, SyncerSpec, TestApi, both_backends, install_crypto_provider,
    metric_sum,
};
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Api, ListParams, PostParams};

both_backends!(a_private_key_in_a_host_file_key_is_refused_and_the_last_good_file_kept);

/// The bound on each wait for the processes to act (a limit, not a delay).
const WITHIN: Duration = Duration::from_secs(30);
const POD: &str = "kube-apiserver-node-a";

/// Replaces Secret `serving`'s data with `tls.crt` = `crt` (and a key file beside it).
async fn put(secrets: &Api<Secret>, crt: &str, key: &str) -> String {
    let mut current = secrets.get("serving").await.unwrap();
    current.data = tls_secret("serving", crt, key).data;
    let updated = secrets
        .replace("serving", &PostParams::default(), &current)
        .await
        .unwrap();
    updated.metadata.resource_version.unwrap()
}

async fn a_private_key_in_a_host_file_key_is_refused_and_the_last_good_file_kept(backend: Backend) {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = TestApi::start_default(backend, tmp.path()).await;
    let client = api.client_with_token(ADMIN_TOKEN);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let ca = Ca::default();
    let good = ca.issue(&e2e::CertSpec::server(&["localhost"]));
    secrets
        .create(
            &PostParams::default(),
            &tls_secret("serving", &good.cert_pem, &good.key_pem),
        )
        .await
        .unwrap();
    let host = tmp.path().join("host");
    std::fs::create_dir(&host).unwrap();
    let file = host.join("serving.crt");
    let spec = SyncerSpec::new(
        &api,
        &tmp.path().join("dest"),
        &[
            "--file",
            &format!("secret/serving/tls.crt={}", file.display()),
        ],
    );
    let mut command = spec.command();
    command.env("POD_NAME", POD);
    let syncer = Syncer {
        process: ChildProcess::start(command),
    };
    e2e::wait_until("the host file", WITHIN, || async {
        std::fs::read_to_string(&file).ok().as_deref() == Some(good.cert_pem.as_str())
    })
    .await;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o644
    );

    // The key in `tls.crt`, after the certificate (a `cat tls.crt tls.key` mistake) and before
    // it: refused each time, the last good file kept.
    let next = ca.issue(&e2e::CertSpec::server(&["localhost"]));
    for (round, crt) in [
        format!("{}{}", next.cert_pem, next.key_pem),
        format!("{}{}", next.key_pem, next.cert_pem),
    ]
    .into_iter()
    .enumerate()
    {
        let version = put(&secrets, &crt, &next.key_pem).await;
        let named = format!("--file secret/serving/tls.crt (resourceVersion {version})");
        e2e::wait_until("the refusal, named", WITHIN, || async {
            let on_disk = std::fs::read_to_string(&file).unwrap_or_default();
            assert!(
                !on_disk.contains("PRIVATE KEY"),
                "the private key reached the 0644 host file"
            );
            let log = syncer.process.stderr_text();
            log.contains(&named) && log.contains("PRIVATE KEY, not a CERTIFICATE")
        })
        .await;
        let (status, body) = syncer.readyz();
        assert_eq!(status, 503, "{body}");
        assert!(body.contains(&named), "/readyz names the refusal: {body}");
        let errors = metric_sum(
            &syncer.metrics(),
            "cert_syncer_syncs_total",
            &["name=\"serving\"", "result=\"error\""],
        );
        assert!(errors > round as f64, "refusals counted: {errors}");
        let on_disk = std::fs::read_to_string(&file).unwrap();
        assert_eq!(on_disk, good.cert_pem, "the last good file is kept");
        assert!(!on_disk.contains("PRIVATE KEY"));
    }
    let events: Api<Event> = Api::namespaced(client, NS);
    e2e::wait_until("the Warning Event", WITHIN, || async {
        events.list(&ListParams::default()).await.is_ok_and(|list| {
            list.items.iter().any(|event| {
                event.reason.as_deref() == Some("CertificateUpdateFailed")
                    && event.type_.as_deref() == Some("Warning")
                    && event.involved_object.name.as_deref() == Some(POD)
                    && event
                        .message
                        .as_deref()
                        .is_some_and(|m| m.contains("secret/serving/tls.crt"))
            })
        })
    })
    .await;

    // Certificates alone again: written, and ready.
    put(&secrets, &next.cert_pem, &next.key_pem).await;
    e2e::wait_until("the next good version", WITHIN, || async {
        std::fs::read_to_string(&file).ok().as_deref() == Some(next.cert_pem.as_str())
    })
    .await;
    e2e::wait_until("ready again", WITHIN, || async { syncer.readyz().0 == 200 }).await;
}
