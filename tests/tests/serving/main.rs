//! Serving through rotation, as processes: `https-server` (reload-lib in a real server) and
//! `tls-load`, the handshake load generator the rotation runs rely on.

mod https_server;
mod reload;
mod tls_load;
