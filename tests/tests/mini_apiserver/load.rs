//! Watch fan-out under load: 50 concurrent kube-rs watchers and one writer doing 1,000 updates;
//! every watcher must see all 1,000 in order. Prints updates/s and fan-out latency (figures, not
//! assertions: the machine is shared).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::{AbortOnDrop, ApiServer, install_crypto_provider};
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;

const WATCHERS: usize = 50;
const UPDATES: usize = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_watchers_each_see_a_thousand_updates_in_order() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let server = ApiServer::start(tmp.path(), &[]);
    let api: Api<ConfigMap> = Api::namespaced(server.recovery_client(), "load");
    let mut object = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("counter".to_owned()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("n".to_owned(), "0".to_owned())])),
        ..Default::default()
    };
    object = api.create(&PostParams::default(), &object).await.unwrap();

    // When each update was acknowledged, to measure fan-out latency.
    let written: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; UPDATES + 1]));
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel(WATCHERS);
    let mut watchers = Vec::new();
    for _ in 0..WATCHERS {
        // One client per watcher: separate connections, as separate processes would have.
        let api: Api<ConfigMap> = Api::namespaced(server.recovery_client(), "load");
        let (written, ready) = (Arc::clone(&written), ready_tx.clone());
        watchers.push(AbortOnDrop(tokio::spawn(async move {
            let stream = watcher(
                api,
                watcher::Config::default().fields("metadata.name=counter"),
            );
            let mut stream = std::pin::pin!(stream);
            let mut seen = Vec::with_capacity(UPDATES);
            let mut latencies = Vec::with_capacity(UPDATES);
            while let Some(event) = stream.try_next().await.unwrap() {
                match event {
                    watcher::Event::InitDone => {
                        let _ = ready.send(()).await;
                    }
                    watcher::Event::Apply(cm) => {
                        let n: usize = cm.data.unwrap()["n"].parse().unwrap();
                        let at = Instant::now();
                        if let Some(sent) = written.lock().unwrap()[n] {
                            latencies.push(at.saturating_duration_since(sent));
                        }
                        seen.push(n);
                        if n == UPDATES {
                            return (seen, latencies);
                        }
                    }
                    _ => {}
                }
            }
            (seen, latencies)
        })));
    }
    for _ in 0..WATCHERS {
        tokio::time::timeout(Duration::from_secs(60), ready_rx.recv())
            .await
            .unwrap();
    }

    let start = Instant::now();
    for n in 1..=UPDATES {
        object.data = Some(BTreeMap::from([("n".to_owned(), n.to_string())]));
        // The acknowledgement time is recorded before the write so that no watcher can see the
        // update before its timestamp exists; latency is therefore slightly overstated.
        written.lock().unwrap()[n] = Some(Instant::now());
        object = api
            .replace("counter", &PostParams::default(), &object)
            .await
            .unwrap();
    }
    let write_time = start.elapsed();

    let mut all_latencies = Vec::new();
    for (index, mut watcher) in watchers.into_iter().enumerate() {
        let (seen, latencies) = watcher
            .join(&format!("watcher {index}"), Duration::from_secs(120))
            .await;
        let expected: Vec<usize> = (1..=UPDATES).collect();
        assert_eq!(
            seen, expected,
            "a watcher missed, repeated or reordered updates"
        );
        all_latencies.extend(latencies);
    }
    let fan_out = start.elapsed();
    all_latencies.sort();
    let pick = |p: f64| all_latencies[((all_latencies.len() - 1) as f64 * p) as usize];
    eprintln!(
        "load: {UPDATES} updates in {:.2} s ({:.0} updates/s), {WATCHERS} watchers all in order; \
         all {} deliveries done after {:.2} s ({:.0} deliveries/s); \
         fan-out latency p50 {:?} p99 {:?} max {:?} ({} build)",
        write_time.as_secs_f64(),
        UPDATES as f64 / write_time.as_secs_f64(),
        WATCHERS * UPDATES,
        fan_out.as_secs_f64(),
        (WATCHERS * UPDATES) as f64 / fan_out.as_secs_f64(),
        pick(0.5),
        pick(0.99),
        all_latencies.last().unwrap(),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
}
