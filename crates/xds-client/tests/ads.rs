//! The client against the testbed's management server over real HTTP/2 on 127.0.0.1: what
//! it subscribes to, what it ACKs and NACKs, and how it comes back after the server goes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use prost::Message;
use testbed::ManagementServer;
use testbed::xds::any;
use tokio::sync::watch;
use xds_client::{Backoff, Endpoint, Handler, Options, Update, Variant, type_url};

const LIMIT: Duration = Duration::from_secs(20);

/// Keeps clusters and assignments by name, wants the assignment of every cluster, and
/// refuses any cluster whose name starts with `bad`.
#[derive(Clone, Default)]
struct Recorder {
    state: Arc<Mutex<Held>>,
    changed: Arc<watch::Sender<u64>>,
}

#[derive(Default)]
struct Held {
    clusters: BTreeSet<String>,
    /// Assignment name -> how many times one arrived.
    assignments: BTreeMap<String, u32>,
    connected: bool,
    streams_up: u32,
}

impl Recorder {
    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn wait(&self, what: &str, mut done: impl FnMut(&Held) -> bool) {
        let mut changed = self.changed.subscribe();
        let check = async {
            loop {
                if done(&self.held()) {
                    return;
                }
                changed.changed().await.expect("recorder alive");
            }
        };
        tokio::time::timeout(LIMIT, check)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
    }
}

impl Handler for Recorder {
    async fn apply(&mut self, update: Update) -> Result<(), String> {
        let result = {
            let mut held = self.held();
            if update.type_url == type_url::CLUSTER {
                let mut names = BTreeSet::new();
                for r in &update.resources {
                    let c = Cluster::decode(r.value.value.as_slice()).map_err(|e| e.to_string())?;
                    if c.name.starts_with("bad") {
                        return Err(format!("cluster `{}` is bad", c.name));
                    }
                    names.insert(c.name);
                }
                if update.complete {
                    held.clusters = names;
                } else {
                    held.clusters.extend(names);
                    for name in &update.removed {
                        held.clusters.remove(name);
                    }
                }
            } else if update.type_url == type_url::ENDPOINT {
                for r in &update.resources {
                    let cla = ClusterLoadAssignment::decode(r.value.value.as_slice())
                        .map_err(|e| e.to_string())?;
                    *held.assignments.entry(cla.cluster_name).or_default() += 1;
                }
            }
            Ok(())
        };
        self.changed.send_modify(|n| *n += 1);
        result
    }

    fn wanted(&self, type_url: &str) -> Arc<BTreeSet<String>> {
        if type_url == type_url::ENDPOINT {
            Arc::new(self.held().clusters.clone())
        } else {
            Arc::default()
        }
    }

    fn connected(&mut self, up: bool) {
        {
            let mut held = self.held();
            held.connected = up;
            held.streams_up += u32::from(up);
        }
        self.changed.send_modify(|n| *n += 1);
    }
}

fn cluster(name: &str) -> (String, envoy_types::pb::google::protobuf::Any) {
    let c = Cluster {
        name: name.into(),
        ..Default::default()
    };
    (name.into(), any(&c))
}

fn assignment(name: &str) -> (String, envoy_types::pb::google::protobuf::Any) {
    let cla = ClusterLoadAssignment {
        cluster_name: name.into(),
        ..Default::default()
    };
    (name.into(), any(&cla))
}

fn options(server: &ManagementServer, variant: Variant) -> Options {
    let mut options = Options::new(
        Endpoint::Tcp(server.local_addr()),
        variant,
        xds_client::node("node-1", "edge"),
    );
    options.backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(200));
    options
}

async fn subscribes_acks_and_nacks(variant: Variant) {
    let server = ManagementServer::start(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("server starts");
    server.set(type_url::CLUSTER, vec![cluster("a"), cluster("b")]);
    server.set(
        type_url::ENDPOINT,
        vec![assignment("a"), assignment("b"), assignment("c")],
    );
    let recorder = Recorder::default();
    let client = tokio::spawn(xds_client::run(options(&server, variant), recorder.clone()));

    // The clusters arrive, then the endpoints they name (and not `c`, which nothing names).
    recorder
        .wait("both assignments", |h| h.assignments.len() == 2)
        .await;
    assert_eq!(
        recorder.held().assignments.keys().collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert!(
        server
            .wait_for(LIMIT, |reqs, _| reqs
                .iter()
                .any(|r| r.type_url == type_url::ENDPOINT && r.is_ack()))
            .await,
        "the endpoints are ACKed"
    );
    let requests = server.requests();
    assert_eq!(
        requests[0].node_id.as_deref(),
        Some("node-1"),
        "the node is on the first request"
    );
    assert!(
        requests[1..].iter().all(|r| r.node_id.is_none()),
        "and only there"
    );
    let eds = requests
        .iter()
        .find(|r| r.type_url == type_url::ENDPOINT)
        .expect("an EDS subscription");
    assert_eq!(eds.names, ["a", "b"]);

    // A refused update: NACKed with the reason; the handler keeps what it had.
    let accepted = server.version(type_url::CLUSTER);
    server.set(type_url::CLUSTER, vec![cluster("a"), cluster("bad-1")]);
    assert!(
        server
            .wait_for(LIMIT, |reqs, _| reqs.iter().any(|r| r.is_nack()))
            .await,
        "a NACK"
    );
    let nack = server
        .requests()
        .into_iter()
        .find(|r| r.is_nack())
        .expect("a NACK");
    assert_eq!(nack.type_url, type_url::CLUSTER);
    assert_eq!(nack.error_detail.as_deref(), Some("cluster `bad-1` is bad"));
    let nacked = server
        .responses()
        .into_iter()
        .rfind(|r| r.type_url == type_url::CLUSTER)
        .expect("the refused response");
    assert_eq!(
        nack.response_nonce, nacked.nonce,
        "the NACK names the response"
    );
    if variant == Variant::StateOfTheWorld {
        assert_eq!(nack.version_info, accepted, "and the last accepted version");
    }
    assert_eq!(
        recorder.held().clusters.iter().collect::<Vec<_>>(),
        ["a", "b"]
    );

    // A good update after it: `d` comes, and its endpoints are asked for. In state of the
    // world the update is the whole set, so `b` goes; in delta, `b`'s removal came in the
    // refused response, so the client still has it (as Envoy would).
    server.set(type_url::ENDPOINT, vec![assignment("a"), assignment("d")]);
    server.set(type_url::CLUSTER, vec![cluster("a"), cluster("d")]);
    let expected: &[&str] = match variant {
        Variant::StateOfTheWorld => &["a", "d"],
        Variant::Delta => &["a", "b", "d"],
    };
    recorder
        .wait("cluster d and its endpoints", |h| {
            h.clusters.iter().collect::<Vec<_>>() == expected && h.assignments.contains_key("d")
        })
        .await;
    client.abort();
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_of_the_world_subscribes_acks_and_nacks() {
    subscribes_acks_and_nacks(Variant::StateOfTheWorld).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_subscribes_acks_and_nacks() {
    subscribes_acks_and_nacks(Variant::Delta).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_server_gets_a_new_stream_with_what_the_client_holds() {
    let server = ManagementServer::start(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("server starts");
    let address = server.local_addr();
    server.set(type_url::CLUSTER, vec![cluster("a")]);
    server.set(type_url::ENDPOINT, vec![assignment("a")]);
    let recorder = Recorder::default();
    let client = tokio::spawn(xds_client::run(
        options(&server, Variant::Delta),
        recorder.clone(),
    ));
    recorder
        .wait("the first endpoints", |h| h.assignments.contains_key("a"))
        .await;
    server.shutdown().await;
    recorder.wait("the stream to end", |h| !h.connected).await;

    let again = ManagementServer::start(address).await.expect("same port");
    again.set(type_url::CLUSTER, vec![cluster("a")]);
    again.set(type_url::ENDPOINT, vec![assignment("a")]);
    recorder
        .wait("a second stream", |h| h.streams_up == 2 && h.connected)
        .await;
    assert!(again.wait_for(LIMIT, |reqs, _| reqs.len() >= 2).await);
    let requests = again.requests();
    let cds = requests
        .iter()
        .find(|r| r.type_url == type_url::CLUSTER)
        .expect("clusters asked for again");
    assert_eq!(cds.node_id.as_deref(), Some("node-1"));
    assert_eq!(
        cds.initial_versions.keys().collect::<Vec<_>>(),
        ["a"],
        "the client says which clusters it holds"
    );
    let eds = requests
        .iter()
        .find(|r| r.type_url == type_url::ENDPOINT)
        .expect("endpoints asked for again");
    assert_eq!(eds.names, ["a"]);
    assert_eq!(eds.initial_versions.keys().collect::<Vec<_>>(), ["a"]);
    client.abort();
    again.shutdown().await;
}

/// The last cluster goes: state of the world asks for nothing more of the endpoints (an
/// empty list would be a wildcard), delta unsubscribes; a new cluster subscribes again.
async fn the_last_name_going_is_no_wildcard(variant: Variant) {
    let server = ManagementServer::start(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("server starts");
    server.set(type_url::CLUSTER, vec![cluster("a")]);
    server.set(type_url::ENDPOINT, vec![assignment("a"), assignment("b")]);
    let recorder = Recorder::default();
    let client = tokio::spawn(xds_client::run(options(&server, variant), recorder.clone()));
    recorder
        .wait("a's endpoints", |h| h.assignments.contains_key("a"))
        .await;

    server.set(type_url::CLUSTER, vec![]);
    recorder
        .wait("no clusters", |h| h.clusters.is_empty())
        .await;
    if variant == Variant::StateOfTheWorld {
        // A new version: the server sends what it was last asked for (`a`); the ACK must
        // not ask for everything.
        server.set(type_url::ENDPOINT, vec![assignment("a"), assignment("b")]);
        recorder
            .wait("a's endpoints again", |h| {
                h.assignments.get("a") == Some(&2)
            })
            .await;
    }
    server.set(type_url::CLUSTER, vec![cluster("b")]);
    recorder
        .wait("b's endpoints", |h| h.assignments.contains_key("b"))
        .await;

    let eds: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.type_url == type_url::ENDPOINT)
        .collect();
    match variant {
        Variant::StateOfTheWorld => {
            // Every request (ACKs too) says what is wanted.
            let mut asked: Vec<&[String]> = eds.iter().map(|r| r.names.as_slice()).collect();
            asked.dedup();
            assert_eq!(asked, [["a"], ["b"]], "never an empty list");
        }
        Variant::Delta => {
            // Subscription changes carry no nonce; ACKs do.
            let eds: Vec<_> = eds.iter().filter(|r| r.response_nonce.is_empty()).collect();
            let removal = server
                .responses()
                .into_iter()
                .find(|r| r.type_url == type_url::CLUSTER && !r.removed.is_empty())
                .expect("the cluster's removal");
            assert_eq!(removal.removed, ["a"]);
            let changes: Vec<(&[String], &[String])> = eds
                .iter()
                .map(|r| (r.names.as_slice(), r.unsubscribed.as_slice()))
                .collect();
            let (a, b, none) = (["a".to_owned()], ["b".to_owned()], []);
            assert_eq!(
                changes,
                [
                    (&a[..], &none[..]),
                    (&none[..], &a[..]),
                    (&b[..], &none[..])
                ]
            );
        }
    }
    client.abort();
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_of_the_world_never_asks_for_an_empty_list() {
    the_last_name_going_is_no_wildcard(Variant::StateOfTheWorld).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_unsubscribes_the_last_name() {
    the_last_name_going_is_no_wildcard(Variant::Delta).await;
}
