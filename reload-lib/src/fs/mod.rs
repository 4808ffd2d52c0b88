//! Filesystem helpers: the atomic directory writer (kubelet `..data` protocol).
