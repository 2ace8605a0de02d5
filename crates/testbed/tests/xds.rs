//! The xDS management server, driven by tonic's generated ADS client over real HTTP/2 on
//! 127.0.0.1: what it sends on subscription and on change, and what it records of ACKs and
//! NACKs, in both variants.

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::rpc::Status;
use prost::Message;
use testbed::ManagementServer;
use testbed::xds::{any, type_url};
use tokio::sync::mpsc;
use tonic::Streaming;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

const LIMIT: Duration = Duration::from_secs(20);

fn cluster(name: &str, connect_timeout_s: i64) -> (String, envoy_types::pb::google::protobuf::Any) {
    let cluster = Cluster {
        name: name.into(),
        connect_timeout: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: connect_timeout_s,
            nanos: 0,
        }),
        ..Default::default()
    };
    (name.into(), any(&cluster))
}

fn assignment(name: &str) -> (String, envoy_types::pb::google::protobuf::Any) {
    let cla = ClusterLoadAssignment {
        cluster_name: name.into(),
        ..Default::default()
    };
    (name.into(), any(&cla))
}

fn node() -> Option<Node> {
    Some(Node {
        id: "node-1".into(),
        cluster: "edge".into(),
        ..Default::default()
    })
}

async fn client(server: &ManagementServer) -> AggregatedDiscoveryServiceClient<Channel> {
    AggregatedDiscoveryServiceClient::connect(format!("http://{}", server.local_addr()))
        .await
        .expect("the management server accepts")
}

/// A state-of-the-world stream: requests go in through `tx`, responses come out of `rx`.
async fn sotw(
    server: &ManagementServer,
) -> (mpsc::Sender<DiscoveryRequest>, Streaming<DiscoveryResponse>) {
    let (tx, rx) = mpsc::channel(8);
    let responses = client(server)
        .await
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .expect("the stream opens")
        .into_inner();
    (tx, responses)
}

async fn delta(
    server: &ManagementServer,
) -> (
    mpsc::Sender<DeltaDiscoveryRequest>,
    Streaming<DeltaDiscoveryResponse>,
) {
    let (tx, rx) = mpsc::channel(8);
    let responses = client(server)
        .await
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .expect("the stream opens")
        .into_inner();
    (tx, responses)
}

async fn ask<T>(tx: &mpsc::Sender<T>, request: T) {
    tx.send(request).await.expect("the stream takes a request");
}

async fn next<T>(responses: &mut Streaming<T>) -> T {
    tokio::time::timeout(LIMIT, responses.message())
        .await
        .expect("a response within the limit")
        .expect("the stream is healthy")
        .expect("the stream is open")
}

fn names_of(response: &DiscoveryResponse) -> Vec<String> {
    response
        .resources
        .iter()
        .map(|any| {
            if any.type_url == type_url::CLUSTER {
                Cluster::decode(any.value.as_slice()).map(|c| c.name)
            } else {
                ClusterLoadAssignment::decode(any.value.as_slice()).map(|c| c.cluster_name)
            }
            .expect("the resource decodes")
        })
        .collect()
}

async fn start() -> ManagementServer {
    ManagementServer::start("127.0.0.1:0".parse().expect("an address"))
        .await
        .expect("the management server binds")
}

#[tokio::test]
async fn state_of_the_world_answers_subscriptions_and_changes_and_records_acks_and_nacks() {
    let server = start().await;
    server.set(type_url::CLUSTER, vec![cluster("a", 1), cluster("b", 1)]);
    server.set(type_url::ENDPOINT, vec![assignment("a"), assignment("b")]);
    let (tx, mut responses) = sotw(&server).await;

    // All clusters (no names: a wildcard type), then only the endpoints asked for.
    ask(
        &tx,
        DiscoveryRequest {
            node: node(),
            type_url: type_url::CLUSTER.into(),
            ..Default::default()
        },
    )
    .await;
    let clusters = next(&mut responses).await;
    assert_eq!(clusters.type_url, type_url::CLUSTER);
    assert_eq!(clusters.version_info, "1");
    assert_eq!(names_of(&clusters), ["a", "b"]);
    ask(
        &tx,
        DiscoveryRequest {
            type_url: type_url::ENDPOINT.into(),
            resource_names: vec!["b".into()],
            ..Default::default()
        },
    )
    .await;
    let endpoints = next(&mut responses).await;
    assert_eq!(names_of(&endpoints), ["b"]);

    // An ACK gets no answer; a change does, with the type's new version.
    ask(
        &tx,
        DiscoveryRequest {
            type_url: type_url::CLUSTER.into(),
            version_info: clusters.version_info.clone(),
            response_nonce: clusters.nonce.clone(),
            ..Default::default()
        },
    )
    .await;
    assert!(
        server
            .wait_for(LIMIT, |requests, _| requests.iter().any(|r| r.is_ack()))
            .await
    );
    server.set(type_url::CLUSTER, vec![cluster("a", 2)]);
    let changed = next(&mut responses).await;
    assert_eq!(changed.type_url, type_url::CLUSTER);
    assert_eq!(changed.version_info, "2");
    assert_eq!(names_of(&changed), ["a"]);
    assert_ne!(changed.nonce, clusters.nonce);

    // A NACK names the nonce it refuses and keeps the last version accepted.
    ask(
        &tx,
        DiscoveryRequest {
            type_url: type_url::CLUSTER.into(),
            version_info: clusters.version_info.clone(),
            response_nonce: changed.nonce.clone(),
            error_detail: Some(Status {
                code: 3,
                message: "cluster a: bad".into(),
                details: Vec::new(),
            }),
            ..Default::default()
        },
    )
    .await;
    assert!(
        server
            .wait_for(LIMIT, |requests, _| requests.iter().any(|r| r.is_nack()))
            .await
    );
    let requests = server.requests();
    assert_eq!(requests[0].node_id.as_deref(), Some("node-1"));
    assert_eq!(requests[1].node_id, None);
    let nack = requests.iter().find(|r| r.is_nack()).expect("a NACK");
    assert_eq!(nack.response_nonce, changed.nonce);
    assert_eq!(nack.version_info, "1");
    assert_eq!(nack.error_detail.as_deref(), Some("cluster a: bad"));
    // The NACK got no answer: a request after it (other endpoint names) is answered next,
    // and the stream answers in order.
    ask(
        &tx,
        DiscoveryRequest {
            type_url: type_url::ENDPOINT.into(),
            resource_names: vec!["a".into()],
            ..Default::default()
        },
    )
    .await;
    let after = next(&mut responses).await;
    assert_eq!(after.type_url, type_url::ENDPOINT);
    assert_eq!(names_of(&after), ["a"]);
    assert_eq!(server.responses().len(), 4);
    assert!(server.requests().iter().all(|r| !r.delta && r.stream == 1));
}

#[tokio::test]
async fn incremental_sends_what_the_client_lacks_and_what_was_removed() {
    let server = start().await;
    server.set(type_url::CLUSTER, vec![cluster("a", 1), cluster("b", 1)]);
    let (tx, mut responses) = delta(&server).await;
    ask(
        &tx,
        DeltaDiscoveryRequest {
            node: node(),
            type_url: type_url::CLUSTER.into(),
            ..Default::default()
        },
    )
    .await;
    let first = next(&mut responses).await;
    let versions: HashMap<String, String> = first
        .resources
        .iter()
        .map(|r| (r.name.clone(), r.version.clone()))
        .collect();
    assert_eq!(versions.len(), 2, "{first:?}");
    ask(
        &tx,
        DeltaDiscoveryRequest {
            type_url: type_url::CLUSTER.into(),
            response_nonce: first.nonce.clone(),
            ..Default::default()
        },
    )
    .await;

    // `a` unchanged, `b` gone, `c` new: only `c` is sent, and `b` removed.
    server.set(type_url::CLUSTER, vec![cluster("a", 1), cluster("c", 1)]);
    let change = next(&mut responses).await;
    let sent: Vec<&str> = change.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(sent, ["c"]);
    assert_eq!(change.removed_resources, ["b"]);

    // A new stream that already holds `a` and `c` at their versions is sent nothing new.
    let mut held = HashMap::new();
    held.insert("a".to_string(), versions["a"].clone());
    held.insert("c".to_string(), change.resources[0].version.clone());
    let (tx2, mut responses2) = delta(&server).await;
    ask(
        &tx2,
        DeltaDiscoveryRequest {
            node: node(),
            type_url: type_url::CLUSTER.into(),
            initial_resource_versions: held.clone(),
            ..Default::default()
        },
    )
    .await;
    let resync = next(&mut responses2).await;
    assert!(resync.resources.is_empty(), "{resync:?}");
    assert!(resync.removed_resources.is_empty(), "{resync:?}");
    let second = server
        .requests()
        .into_iter()
        .find(|r| r.stream == 2)
        .expect("the second stream's request");
    assert!(second.delta);
    assert_eq!(second.initial_versions.len(), 2);
    drop(tx);
}

#[tokio::test]
async fn shutdown_ends_the_streams_and_a_new_server_takes_the_port() {
    let server = start().await;
    server.set(type_url::CLUSTER, vec![cluster("a", 1)]);
    let (tx, mut responses) = sotw(&server).await;
    ask(
        &tx,
        DiscoveryRequest {
            node: node(),
            type_url: type_url::CLUSTER.into(),
            ..Default::default()
        },
    )
    .await;
    next(&mut responses).await;
    server.shutdown().await;
    let ended = tokio::time::timeout(LIMIT, async {
        loop {
            match responses.message().await {
                Ok(Some(_)) => continue,
                _ => return,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the stream ends when the server goes away");

    // The same address serves again (what a test restarting its control plane needs).
    let addr = server.local_addr();
    let again = ManagementServer::start(addr)
        .await
        .expect("the port is free once shutdown returns");
    again.set(type_url::CLUSTER, vec![cluster("b", 1)]);
    let (tx, mut responses) = sotw(&again).await;
    ask(
        &tx,
        DiscoveryRequest {
            node: node(),
            type_url: type_url::CLUSTER.into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(names_of(&next(&mut responses).await), ["b"]);
}
