//! The union step: a bundle that is exactly the unexpired CAs of its sources, in source order,
//! each once (library-go's `CombineCABundleConfigMaps`; kube-apiserver's `client-ca`,
//! `csr-controller-ca`). A source the config writes is taken as its step left it (stored); any
//! other is read.

use crate::pki::Cert;
use crate::regenerate::config::Union;
use crate::regenerate::ctx::Ctx;
use crate::regenerate::intermediate;
use crate::regenerate::objects::{BundleKind, write_bundle};
use crate::regenerate::phases::bundles::settled;
use crate::regenerate::report::Report;
use crate::regenerate::trust::BundleState;

/// Runs the step of union `config`; `ours`: the states of the sources this config writes
/// (each after its step).
pub(crate) async fn step(
    ctx: &Ctx<'_>,
    config: &Union,
    ours: &[&BundleState],
    report: &mut Report,
) -> BundleState {
    let outcome = one(ctx, config, ours, report).await;
    settled(ctx, &config.object, outcome, report).await
}

async fn one(
    ctx: &Ctx<'_>,
    config: &Union,
    ours: &[&BundleState],
    report: &mut Report,
) -> Result<Vec<Cert>, String> {
    let mut sources: Vec<Vec<Cert>> = Vec::new();
    let mut unavailable = Vec::new();
    for source in &config.sources {
        match ours.iter().find(|state| state.object == *source) {
            Some(state) => match &state.stored {
                Ok(certs) => sources.push(certs.clone()),
                Err(err) => unavailable.push(format!("{source} ({err})")),
            },
            // Another component's bundle, read only: a missing one adds nothing; an
            // unreadable one fails the union rather than drop its CAs.
            None => match ctx.read_bundle(source).await {
                Ok((_, certs)) => sources.push(certs),
                Err(err) => unavailable.push(format!("{source} ({err})")),
            },
        }
    }
    if !unavailable.is_empty() {
        return Err(format!(
            "skipped, source {} unavailable",
            unavailable.join(", ")
        ));
    }
    let sources: Vec<&[Cert]> = sources.iter().map(Vec::as_slice).collect();
    let desired = intermediate::union(&sources, ctx.now);
    if desired.is_empty() {
        // Never an empty client CA bundle: that would lock every client out.
        return Err("skipped, its sources hold no unexpired CA".to_owned());
    }
    let (existing, _) = ctx.read_bundle(&config.object).await?;
    write_bundle(
        ctx,
        &config.object,
        existing,
        BundleKind::Union,
        |_| desired.clone(),
        report,
    )
    .await
}
