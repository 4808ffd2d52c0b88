//! `cert-syncer regenerate`: the controller's modes, replicas and bad input, and the built-in
//! OpenShift profiles next to OpenShift's own controller.

mod controller;
mod fights;
mod fixture;
mod kube_controller_manager_profile;
mod openshift_parity;
mod startup;
