//! `cert-syncer`: the sidecars that keep a control plane's certificates in step with the
//! Kubernetes API, one subcommand each:
//!
//! - `sync` mirrors named Secrets and ConfigMaps from the apiserver (over localhost, through the
//!   `localhost-recovery` SNI name) into a resource directory with atomic directory swaps;
//! - `regenerate` regenerates signers, CA bundles and certificates declared in a config file or
//!   a built-in profile (`--profile openshift-kube-apiserver`,
//!   `openshift-kube-controller-manager`, `openshift-kube-scheduler`), by default only when they
//!   are expired or missing;
//! - `node` keeps one host CA bundle (the kubelet's `kubelet-ca.crt`: `--preset
//!   openshift-kubelet-ca`) assembled from API objects on every node;
//! - `approve-kubelet-csr` (opt-in) approves this node's kubelet client CSR while its
//!   certificate on disk is expired or absent;
//! - `inspect` lists certificates on disk or in a namespace and what is wrong with them;
//! - `restart-on-change` (opt-in) restarts a container of its pod whose server reads its client
//!   certificate only at start, when that certificate changes on disk to a valid pair.
//!
//! The work lives in the library (`src/lib.rs`, in layers: `app` over the jobs over `kube`,
//! `pki` and `base`; ARCHITECTURE.md, "Inside cert-syncer"). `main` parses the flags, installs
//! logging and maps the outcome to an exit code: 0 after a clean shutdown, 1 on a fatal runtime
//! error, 2 on bad flags or configuration.

use std::process::ExitCode;

use cert_syncer::cli;
use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    init_tracing(cli.log_format);
    // One crypto provider for the whole process (kube's rustls and ours).
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("cert-syncer: cannot start the runtime: {err}");
            return ExitCode::from(1);
        }
    };
    let outcome = runtime.block_on(cert_syncer::run(cli.command));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let code = if err
                .downcast_ref::<cert_syncer::error::ConfigError>()
                .is_some()
            {
                2
            } else {
                1
            };
            eprintln!("cert-syncer: {err:#}");
            ExitCode::from(code)
        }
    }
}

fn init_tracing(format: cli::LogFormat) {
    let directives = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned());
    // kube-client logs a whole response body at WARN when it cannot decode it (Secrets: private
    // keys). Every object is decoded by `cert_syncer`'s own code, so this only silences a
    // second line of defence, unless kube_client's logging is asked for by name.
    let directives = if directives.contains("kube_client") {
        directives
    } else {
        format!("{directives},kube_client::client=error")
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&directives)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube_client::client=error"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        cli::LogFormat::Text => builder.init(),
        cli::LogFormat::Json => builder.json().init(),
    }
}
