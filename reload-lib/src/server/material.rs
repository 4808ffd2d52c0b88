//! The reload engine of a serving set: its sources (each pair, the client-CA bundle with its
//! CRLs), which of them a pass reads, and how each is parsed and checked against the material
//! policy before `publish` builds a snapshot from what was accepted.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use sha2::{Digest as _, Sha256};

use crate::error::{Error, InvalidMaterial, Result};
use crate::material::{CertInfo, LoadedKey, ParsedBundle, ParsedPair, covers, normalize_name};
use crate::policy;
use crate::reload::{Material, Pass};
use crate::source::{CertKeyPaths, PassReader};
use crate::status::{Served, ServedCert};
use crate::watch::{Dirty, Interest, watch_path};

use super::auth::ClientAuth;
use super::config::{ClientCaConfig, Configure, SniEntry, SniNames};
use super::resolver::{PairEntry, Rank};
use super::snapshot::ServingSnapshot;
use super::{identity, sessions};

/// How a pair's names are chosen, which sets its precedence.
#[derive(Debug, Clone)]
pub(super) enum Role {
    /// The default pair: served without SNI and for unmatched names; its own certificate names
    /// come after every SNI pair's.
    Default,
    /// Configured names; each must be covered by the certificate's SANs.
    Explicit(Vec<String>),
    /// The certificate's DNS SANs (or its CN when it has none), re-read on every reload.
    FromCertificate,
}

/// SHA-256 of the bytes a source was built from.
pub(super) type Digest = [u8; 32];

/// What a pair was built from: the SHA-256 of its certificate file and, when the key is a file
/// of its own, of the key file. Kept apart so a pass can tell a pair with one file changed (a
/// writer half way through a rotation) from one with both changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PairDigest {
    pub(super) cert: Digest,
    pub(super) key: Option<Digest>,
}

/// One certificate/key pair of the set, and what was last accepted from it.
pub(super) struct PairSource {
    pub(super) paths: CertKeyPaths,
    /// The certificate and key files in [`watch_path`] form, when they are two files.
    pub(super) two_files: Option<[PathBuf; 2]>,
    pub(super) role: Role,
    /// For logs, status and metrics: `default`, `sni:<names>` or `sni:from-certificate`.
    pub(super) label: String,
    pub(super) rank: Rank,
    /// Digest of the bytes `entry` was built from.
    pub(super) digest: Option<PairDigest>,
    /// What is served from this source; `None` only before start-up.
    pub(super) entry: Option<Arc<PairEntry>>,
    /// Digest of bytes refused once as a shortened chain: seen again, they are a settled write.
    pub(super) shortened_seen: Option<PairDigest>,
}

impl PairSource {
    fn new(paths: CertKeyPaths, role: Role, label: String, rank: Rank) -> Self {
        let two_files = (paths.cert() != paths.key())
            .then(|| [watch_path(paths.cert()), watch_path(paths.key())]);
        Self {
            paths,
            two_files,
            role,
            label,
            rank,
            digest: None,
            entry: None,
            shortened_seen: None,
        }
    }

    /// The names this source claims when serving a certificate with `info`.
    pub(super) fn names(&self, info: &CertInfo) -> BTreeSet<String> {
        match &self.role {
            Role::Explicit(names) => names.iter().cloned().collect(),
            Role::Default | Role::FromCertificate => certificate_names(info)
                .iter()
                .map(|name| normalize_name(name))
                .collect(),
        }
    }
}

/// The client-CA bundle (with its CRLs), and what was last accepted from it.
pub(super) struct CaSource {
    pub(super) config: ClientCaConfig,
    pub(super) digest: Option<Digest>,
    pub(super) current: Option<Arc<AcceptedCa>>,
    /// Every CRL series accepted so far, for as long as the process runs (bounded).
    pub(super) crl_history: policy::CrlHistory,
}

/// A parsed client-CA bundle and the verifier built from it.
pub(super) struct AcceptedCa {
    pub(super) bundle: ParsedBundle,
    /// What the handshake uses.
    pub(super) verifier: Arc<dyn ClientCertVerifier>,
    /// The full verification, for [`ClientIdentity`] after the handshake.
    pub(super) strict: Arc<dyn ClientCertVerifier>,
    pub(super) served: Arc<[Arc<ServedCert>]>,
}

/// What every snapshot's `ServerConfig` is built with.
pub(super) struct Settings {
    pub(super) provider: Arc<CryptoProvider>,
    pub(super) alpn: Vec<Vec<u8>>,
    pub(super) configure: Option<Configure>,
    pub(super) session_cache_size: usize,
    /// Files larger than this are refused unread.
    pub(super) max_file_size: u64,
}

/// Everything the reloader reads for a serving set, per source, and what it accepted last.
///
/// Sources are numbered: the pairs `0..pairs.len()` (0 is the default pair, then SNI pairs in
/// configuration order), then the client-CA bundle.
pub(super) struct ServingMaterial {
    pub(super) pairs: Vec<PairSource>,
    pub(super) client_ca: Option<CaSource>,
    pub(super) settings: Settings,
    /// File (in [`watch_path`] form) → the sources that read it.
    pub(super) by_file: HashMap<PathBuf, Vec<usize>>,
    /// Directory → the sources that read a file in it (for `..data` swaps).
    pub(super) by_dir: HashMap<PathBuf, Vec<usize>>,
    /// Sources the last pass rejected: every pass re-reads them until they are accepted.
    pub(super) failing: BTreeSet<usize>,
    /// The client-trust epoch sessions are bound to (see `sessions`).
    pub(super) trust_epoch: sessions::Epoch,
    /// Whether every rejection of the last pass was a pair caught between its two writes.
    pub(super) rejected_mid_write: bool,
}

/// What one pass accepted from a pair.
pub(super) struct AcceptedPair {
    pub(super) id: usize,
    pub(super) digest: PairDigest,
    pub(super) entry: Arc<PairEntry>,
}

impl ServingMaterial {
    pub(super) fn new(
        default: CertKeyPaths,
        sni: Vec<SniEntry>,
        client_ca: Option<ClientCaConfig>,
        settings: Settings,
    ) -> Self {
        // Precedence: configured names in configuration order, then names from certificates in
        // configuration order, then the default pair's own names.
        const FROM_CERTIFICATE: Rank = 1 << 32;
        const DEFAULT: Rank = 2 << 32;
        let mut pairs = vec![PairSource::new(
            default,
            Role::Default,
            "default".to_owned(),
            DEFAULT,
        )];
        for (index, entry) in sni.into_iter().enumerate() {
            let (role, label, rank) = match entry.names {
                SniNames::Explicit(names) => {
                    let label = format!("sni:{}", names.join(","));
                    (Role::Explicit(names), label, index as Rank)
                }
                SniNames::FromCertificate => (
                    Role::FromCertificate,
                    "sni:from-certificate".to_owned(),
                    FROM_CERTIFICATE + index as Rank,
                ),
            };
            pairs.push(PairSource::new(entry.paths, role, label, rank));
        }
        let mut material = Self {
            pairs,
            client_ca: client_ca.map(|config| CaSource {
                config,
                digest: None,
                current: None,
                crl_history: policy::CrlHistory::default(),
            }),
            settings,
            by_file: HashMap::new(),
            by_dir: HashMap::new(),
            failing: BTreeSet::new(),
            trust_epoch: [0; 8],
            rejected_mid_write: false,
        };
        let mut files: Vec<(usize, PathBuf)> = Vec::new();
        for (id, pair) in material.pairs.iter().enumerate() {
            files.push((id, pair.paths.cert().to_owned()));
            files.push((id, pair.paths.key().to_owned()));
        }
        if let Some(ca) = &material.client_ca {
            let id = material.ca_id();
            files.push((id, ca.config.path.clone()));
            files.extend(ca.config.crls.iter().map(|crl| (id, crl.clone())));
        }
        for (id, file) in files {
            let file = watch_path(&file);
            if let Some(dir) = file.parent() {
                push_unique(material.by_dir.entry(dir.to_owned()).or_default(), id);
            }
            push_unique(material.by_file.entry(file).or_default(), id);
        }
        material
    }

    /// The source number of the client-CA bundle.
    fn ca_id(&self) -> usize {
        self.pairs.len()
    }

    fn source_count(&self) -> usize {
        self.pairs.len() + usize::from(self.client_ca.is_some())
    }

    /// The sources a pass reads: every one at start-up and for unattributed changes; otherwise
    /// those whose files or directories were marked, and those still being retried.
    fn sources_to_read(&self, dirty: &Dirty, start: bool) -> BTreeSet<usize> {
        if start || dirty.all {
            return (0..self.source_count()).collect();
        }
        let mut todo = self.failing.clone();
        for file in &dirty.files {
            todo.extend(self.by_file.get(file).into_iter().flatten());
        }
        for dir in &dirty.dirs {
            todo.extend(self.by_dir.get(dir).into_iter().flatten());
        }
        todo
    }

    /// Reads pair `id`; `Ok(None)` when its bytes are what is served. Parses and checks
    /// otherwise (counted in `parsed`). `mid_write` tells whether a rejection is a key that does
    /// not match its certificate with only one of the two files changed: a writer half way.
    fn pass_pair(
        &mut self,
        id: usize,
        reader: &mut PassReader,
        now: i64,
        parsed: &mut usize,
        mid_write: &mut bool,
    ) -> Result<Option<AcceptedPair>> {
        let source = &self.pairs[id];
        let paths = &source.paths.clone();
        let cert = reader.read(paths.cert())?;
        let key = if paths.key() == paths.cert() {
            None
        } else {
            Some(reader.read(paths.key())?)
        };
        let digest = PairDigest {
            cert: digest([&cert[..]]),
            key: key.as_deref().map(|key| digest([key])),
        };
        if source.digest == Some(digest) {
            return Ok(None);
        }
        *parsed += 1;
        let key = key.as_deref().unwrap_or(&cert);
        // The served key, if this pass finds the same one (a certificate renewed for it).
        let loaded = source.entry.as_ref().map(|entry| LoadedKey {
            digest: &entry.key_digest,
            key: &entry.certified.key,
        });
        let pair = ParsedPair::parse_reusing(
            paths.cert(),
            &cert,
            paths.key(),
            key,
            &self.settings.provider,
            loaded,
        )
        .inspect_err(|err| {
            *mid_write = err.invalid_material() == Some(&InvalidMaterial::KeyMismatch)
                && source.digest.is_some_and(|served| {
                    digest.key.is_some()
                        && (served.cert == digest.cert) != (served.key == digest.key)
                });
        })?;
        // Never trade a valid chain for an expired or not yet valid one, nor a full chain for
        // one caught mid-write.
        let current = source.entry.as_ref();
        policy::may_replace_chain(
            paths.cert(),
            pair.validity,
            current.map(|entry| entry.validity),
            now,
        )?;
        let shortened = current.map_or(Ok(()), |current| {
            policy::may_shorten_chain(
                paths.cert(),
                &pair.certified.cert,
                &current.certified.cert,
                source.shortened_seen == Some(digest),
            )
        });
        if let Err(err) = shortened {
            self.pairs[id].shortened_seen = Some(digest);
            return Err(err);
        }
        let source = &self.pairs[id];
        if let Role::Explicit(names) = &source.role {
            for name in names {
                if !pair.info.dns_names.iter().any(|dns| covers(dns, name)) {
                    return Err(Error::invalid(
                        paths.cert(),
                        InvalidMaterial::NameNotCovered(name.clone()),
                    ));
                }
            }
        }
        Ok(Some(AcceptedPair {
            id,
            digest,
            entry: Arc::new(PairEntry {
                key_digest: pair.key_digest,
                validity: pair.validity,
                certified: pair.certified,
                served: Arc::new(ServedCert {
                    source: source.label.clone(),
                    path: paths.cert().to_owned(),
                    info: pair.info,
                }),
            }),
        }))
    }

    /// Reads the client-CA bundle and its CRLs; `Ok(None)` when unchanged. Otherwise parses
    /// them and builds the verifier (counted in `parsed`).
    fn pass_ca(
        &self,
        reader: &mut PassReader,
        now: i64,
        parsed: &mut usize,
    ) -> Result<Option<(Digest, AcceptedCa)>> {
        let Some(source) = &self.client_ca else {
            return Ok(None);
        };
        let config = &source.config;
        let bundle_pem = reader.read(&config.path)?;
        let crl_pems = config
            .crls
            .iter()
            .map(|path| reader.read(path))
            .collect::<Result<Vec<_>>>()?;
        let digest =
            digest(std::iter::once(&bundle_pem[..]).chain(crl_pems.iter().map(|c| &c[..])));
        if source.digest == Some(digest) {
            return Ok(None);
        }
        *parsed += 1;
        let mut bundle = ParsedBundle::parse(&config.path, &bundle_pem)?;
        for (path, pem) in config.crls.iter().zip(&crl_pems) {
            bundle.add_crls(path, pem)?;
        }
        policy::crls_issued_by_bundle(&mut bundle)?;
        policy::may_replace_crls(
            &bundle,
            source.current.as_ref().map(|ca| &ca.bundle),
            &source.crl_history,
            now,
        )?;
        let roots = Arc::new(bundle.root_store(&config.path)?);
        let mut verifier =
            WebPkiClientVerifier::builder_with_provider(roots, Arc::clone(&self.settings.provider))
                .with_crls(bundle.crls.iter().cloned());
        if config.auth != ClientAuth::Required {
            verifier = verifier.allow_unauthenticated();
        }
        let strict = verifier.build().map_err(|source| Error::BuildVerifier {
            path: config.path.clone(),
            source,
        })?;
        let verifier = match config.auth {
            ClientAuth::Request => Arc::new(identity::RequestVerifier {
                strict: Arc::clone(&strict),
            }) as Arc<dyn ClientCertVerifier>,
            ClientAuth::Required | ClientAuth::Optional => Arc::clone(&strict),
        };
        let served = bundle
            .infos
            .iter()
            .map(|info| {
                Arc::new(ServedCert {
                    source: "client-ca".to_owned(),
                    path: config.path.clone(),
                    info: info.clone(),
                })
            })
            .collect();
        Ok(Some((
            digest,
            AcceptedCa {
                bundle,
                verifier,
                strict,
                served,
            },
        )))
    }
}

fn push_unique(ids: &mut Vec<usize>, id: usize) {
    if !ids.contains(&id) {
        ids.push(id);
    }
}

/// SHA-256 over `parts`, each prefixed with its length (so moving bytes between parts changes
/// the digest).
fn digest<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Digest {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    hasher.finalize().into()
}

/// DNS SANs, or the CN when there are none and it looks like a DNS name (as Kubernetes does).
fn certificate_names(info: &CertInfo) -> Vec<String> {
    if !info.dns_names.is_empty() {
        return info.dns_names.clone();
    }
    info.common_name()
        .filter(|cn| {
            !cn.is_empty()
                && cn.parse::<std::net::IpAddr>().is_err()
                && cn
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '*'))
        })
        .map(|cn| vec![cn.to_ascii_lowercase()])
        .unwrap_or_default()
}

impl Material for ServingMaterial {
    type Snapshot = ServingSnapshot;

    fn interest(&self) -> Interest {
        let mut interest = Interest::default();
        for file in self.by_file.keys() {
            interest.add_file(file);
        }
        interest
    }

    /// Reads the marked sources (all at start-up), parses only those whose bytes changed, and
    /// publishes a snapshot that replaces just their entries. A rejected source keeps its last
    /// good entry and is retried; the others' changes are published regardless.
    fn load(
        &mut self,
        current: Option<&ServingSnapshot>,
        dirty: Dirty,
        now: i64,
    ) -> Pass<ServingSnapshot> {
        let todo = self.sources_to_read(&dirty, current.is_none());
        let mut reader = PassReader::new(self.settings.max_file_size);
        let mut pass = Pass {
            snapshot: None,
            newly_served: Vec::new(),
            rejected: None,
            sources_read: todo.len(),
            sources_parsed: 0,
            symlinks: Vec::new(),
        };
        let mut accepted = Vec::new();
        let mut new_ca = None;
        let mut failing = BTreeSet::new();
        self.rejected_mid_write = true;
        for id in todo {
            let mut mid_write = false;
            let outcome = if id == self.ca_id() {
                self.pass_ca(&mut reader, now, &mut pass.sources_parsed)
                    .map(|ca| new_ca = ca)
            } else {
                self.pass_pair(
                    id,
                    &mut reader,
                    now,
                    &mut pass.sources_parsed,
                    &mut mid_write,
                )
                .map(|pair| accepted.extend(pair))
            };
            if let Err(err) = outcome {
                self.rejected_mid_write &= mid_write;
                if pass.rejected.is_some() {
                    tracing::debug!(
                        error = &err as &dyn std::error::Error,
                        "another source rejected in the same pass"
                    );
                }
                failing.insert(id);
                pass.rejected.get_or_insert(err);
            }
        }
        self.failing = failing;
        self.rejected_mid_write &= pass.rejected.is_some();
        pass.symlinks = reader.into_symlinks();
        if (current.is_none() && pass.rejected.is_some())
            || (accepted.is_empty() && new_ca.is_none())
        {
            return pass;
        }
        let attempted: Vec<usize> = accepted
            .iter()
            .map(|pair| pair.id)
            .chain(new_ca.as_ref().map(|_| self.ca_id()))
            .collect();
        match self.publish(current, accepted, new_ca, &mut pass.newly_served) {
            Ok(snapshot) => pass.snapshot = Some(snapshot),
            Err(err) => {
                // Nothing was committed: retry every source of the pass, not just the rejected.
                self.rejected_mid_write = false;
                self.failing.extend(attempted);
                pass.newly_served.clear();
                pass.rejected = Some(err);
            }
        }
        pass
    }

    fn served(snapshot: &ServingSnapshot) -> Served {
        snapshot.served.clone()
    }

    fn awaits_partner(&self, dirty: &Dirty) -> bool {
        if dirty.all {
            return false;
        }
        let marked = |file: &PathBuf| {
            dirty.files.contains(file) || file.parent().is_some_and(|dir| dirty.dirs.contains(dir))
        };
        dirty.files.iter().any(|file| {
            self.by_file.get(file).into_iter().flatten().any(|&id| {
                self.pairs
                    .get(id)
                    .and_then(|pair| pair.two_files.as_ref())
                    .is_some_and(|[cert, key]| marked(cert) != marked(key))
            })
        })
    }

    fn rejected_mid_write(&self) -> bool {
        self.rejected_mid_write
    }
}

#[cfg(test)]
mod tests;
