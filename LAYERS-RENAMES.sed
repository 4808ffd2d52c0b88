# The layers rename map (branch `layers`), as sed over cert-syncer/src/**/*.rs:
#   sed -i -E -f LAYERS-RENAMES.sed $(git ls-files 'cert-syncer/src/*.rs')
# File moves (git mv): access.rs cli.rs cli/ health.rs shutdown.rs -> app/; error.rs kind.rs
# names.rs time.rs input_file.rs -> base/ (Readiness out of health.rs into base/readiness.rs);
# connection.rs connection/ watch.rs leader.rs events.rs decode.rs fetched.rs fake_api.rs ->
# kube/; metrics.rs -> sync/metrics.rs; pki.rs -> pki/mod.rs split into pki/parse.rs,
# pki/verify.rs, pki/issue.rs; pki/subject.rs -> pki/issue/subject.rs; regenerate/keys.rs ->
# pki/issue/keys.rs; node's parse_mode/parse_owner/parse_signal -> app/cli/node.rs.
s/crate::health::Readiness/crate::base::readiness::Readiness/g
s/crate::health::serve/crate::app::health::serve/g
s/crate::error\b/crate::base::error/g
s/crate::kind\b/crate::base::kind/g
s/crate::names\b/crate::base::names/g
s/crate::time\b/crate::base::time/g
s/crate::input_file\b/crate::base::input_file/g
s/crate::connection\b/crate::kube::connection/g
s/crate::watch\b/crate::kube::watch/g
s/crate::leader\b/crate::kube::leader/g
s/crate::events\b/crate::kube::events/g
s/crate::decode\b/crate::kube::decode/g
s/crate::fetched\b/crate::kube::fetched/g
s/crate::fake_api\b/crate::kube::fake_api/g
s/crate::cli\b/crate::app::cli/g
s/crate::access\b/crate::app::access/g
s/crate::shutdown\b/crate::app::shutdown/g
s/crate::metrics\b/crate::sync::metrics/g
s/crate::regenerate::KeyType\b/crate::pki::KeyType/g
s/crate::pki::verify::check_serving_names\b/crate::pki::check_serving_names/g
s/crate::pki::verify::verify_chain\b/crate::pki::verify_chain/g
s/crate::regenerate::keys::KeyType\b/crate::pki::KeyType/g
s/super::keys::KeyType\b/crate::pki::KeyType/g
s/super::KeyType\b/crate::pki::KeyType/g
