//! Run with: `cargo run -p mini-apiserver -- --listen 127.0.0.1:6443 --cert tls.crt --key tls.key --token-auth-file tokens.csv [--sni localhost-recovery=r.crt,r.key] [--state-file state.json]`
//!
//! A small Kubernetes-API-compatible server for Secrets, ConfigMaps, Events and Leases, serving
//! TLS through reload-lib: it plays the kube-apiserver in the recovery demo and the end-to-end
//! tests. See the `mini_apiserver` library for what it supports. Logs: `RUST_LOG` (stderr).
//!
//! Exit codes: 0 after SIGTERM/SIGINT, 1 on a runtime error (unreadable files, bad
//! certificates, address in use), 2 on bad flags.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let settings = match mini_apiserver::Flags::parse().settings() {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("mini-apiserver: {err:#}");
            return std::process::ExitCode::from(2);
        }
    };
    examples::serve::init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("mini-apiserver: cannot start the runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(mini_apiserver::run(settings)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("mini-apiserver: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
