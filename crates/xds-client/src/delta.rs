//! One incremental stream (`DeltaAggregatedResources`).

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::UnboundedReceiverStream;

use crate::subscription::{Subscriptions, TypeState};
use crate::transport::AdsClient;
use crate::{Handler, Node, Resource, StreamError, Update};

/// Runs one stream until it ends. The error says why, and whether a response came first.
pub(crate) async fn stream<H: Handler>(
    mut client: AdsClient,
    node: &Node,
    subscriptions: &mut Subscriptions,
    handler: &mut H,
) -> Result<(), (StreamError, bool)> {
    subscriptions.new_stream(handler);
    let (requests, queue) = mpsc::unbounded_channel();
    let mut node = Some(node.clone());
    for state in subscriptions.iter_mut().filter(|s| s.is_subscribed()) {
        // Wildcard types subscribe with no names; the others by name. The versions held let
        // the server send only what changed while the client was away.
        let _ = requests.send(DeltaDiscoveryRequest {
            node: node.take(),
            type_url: state.type_url.to_owned(),
            resource_names_subscribe: if state.is_wildcard() {
                Vec::new()
            } else {
                state.names.iter().cloned().collect()
            },
            initial_resource_versions: state
                .held
                .iter()
                .map(|(name, version)| (name.clone(), version.clone()))
                .collect(),
            ..Default::default()
        });
    }
    let mut responses = client
        .delta_aggregated_resources(UnboundedReceiverStream::new(queue))
        .await
        .map_err(|status| (StreamError::Refused(status), false))?
        .into_inner();
    handler.connected(true);
    let mut responded = false;
    loop {
        let response = crate::next_response(&mut responses, responded).await?;
        responded = true;
        if let Some(ack) = receive(response, subscriptions, handler).await {
            crate::send(&requests, ack)?;
        }
        for (type_url, (added, removed)) in subscriptions.changes(handler) {
            let change = DeltaDiscoveryRequest {
                type_url: type_url.to_owned(),
                resource_names_subscribe: added,
                resource_names_unsubscribe: removed,
                ..Default::default()
            };
            crate::send(&requests, change)?;
        }
    }
}

/// Hands a response to the handler; returns the ACK or NACK to send.
async fn receive<H: Handler>(
    response: DeltaDiscoveryResponse,
    subscriptions: &mut Subscriptions,
    handler: &mut H,
) -> Option<DeltaDiscoveryRequest> {
    let Some(state) = subscriptions.get_mut(&response.type_url) else {
        tracing::warn!(type_url = %response.type_url, "xDS response of a type not subscribed; ignored");
        return None;
    };
    let state: &TypeState = state;
    let mut versions = Vec::with_capacity(response.resources.len());
    let mut resources = Vec::with_capacity(response.resources.len());
    let mut refused = None;
    for resource in response.resources {
        if resource.name.is_empty() {
            // Delta removes and versions resources by this name.
            refused = Some("a resource without a name".to_owned());
            continue;
        }
        if !state.is_wildcard() && !state.names.contains(&resource.name) {
            // Sent before the server saw an unsubscribe: not wanted, not held.
            continue;
        }
        match resource.resource {
            Some(value) => {
                versions.push((resource.name.clone(), resource.version.clone()));
                resources.push(Resource {
                    name: resource.name,
                    version: resource.version,
                    value,
                });
            }
            // No body and the version held: a TTL heartbeat, nothing changes (TTLs are not
            // tracked; a resource stays until removed). Anything else cannot be put in force.
            None if state.held.get(&resource.name) == Some(&resource.version) => {}
            None => refused = Some(format!("resource `{}` has no body", resource.name)),
        }
    }
    let outcome = match refused {
        Some(reason) => Err(reason),
        // Only heartbeats, or what is no longer wanted: nothing to put in force.
        None if resources.is_empty() && response.removed_resources.is_empty() => Ok(()),
        None => {
            let update = Update {
                type_url: response.type_url.clone(),
                complete: false,
                resources,
                removed: response.removed_resources.clone(),
                version_info: response.system_version_info,
            };
            handler.apply(update).await
        }
    };
    let state = subscriptions.get_mut(&response.type_url)?;
    state.nonce = response.nonce.clone();
    let error_detail = match outcome {
        Ok(()) => {
            state.held.extend(versions);
            for name in &response.removed_resources {
                state.held.remove(name);
            }
            None
        }
        Err(reason) => Some(crate::nack_status(reason)),
    };
    Some(DeltaDiscoveryRequest {
        type_url: response.type_url,
        response_nonce: response.nonce,
        error_detail,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeSet;

    use envoy_types::pb::envoy::service::discovery::v3::Resource as Envelope;

    use super::*;
    use crate::type_url;

    #[derive(Default)]
    struct Count {
        updates: Vec<usize>,
    }

    impl Handler for Count {
        async fn apply(&mut self, update: Update) -> Result<(), String> {
            self.updates.push(update.resources.len());
            Ok(())
        }
        fn wanted(&self, _: &str) -> std::sync::Arc<BTreeSet<String>> {
            std::sync::Arc::default()
        }
        fn connected(&mut self, _: bool) {}
    }

    fn heartbeat(name: &str, nonce: &str) -> DeltaDiscoveryResponse {
        DeltaDiscoveryResponse {
            type_url: type_url::CLUSTER.into(),
            resources: vec![Envelope {
                name: name.into(),
                version: "v1".into(),
                ttl: Some(envoy_types::pb::google::protobuf::Duration {
                    seconds: 30,
                    nanos: 0,
                }),
                ..Default::default()
            }],
            nonce: nonce.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_resource_without_a_body_is_a_heartbeat_of_the_version_held_and_refused_otherwise() {
        let mut handler = Count::default();
        let mut subscriptions = Subscriptions::new(&handler);
        let state = subscriptions.get_mut(type_url::CLUSTER).unwrap();
        state.held.insert("a".into(), "v1".into());

        let ack = receive(heartbeat("a", "1"), &mut subscriptions, &mut handler)
            .await
            .unwrap();
        assert_eq!((ack.response_nonce.as_str(), ack.error_detail), ("1", None));
        assert!(handler.updates.is_empty(), "nothing to put in force");

        let nack = receive(heartbeat("z", "2"), &mut subscriptions, &mut handler)
            .await
            .unwrap();
        assert_eq!(nack.response_nonce, "2");
        assert!(
            nack.error_detail
                .unwrap()
                .message
                .contains("`z` has no body")
        );
        // A new version without a body is no heartbeat.
        let mut changed = heartbeat("a", "3");
        changed.resources[0].version = "v2".into();
        let nack = receive(changed, &mut subscriptions, &mut handler)
            .await
            .unwrap();
        assert!(
            nack.error_detail
                .unwrap()
                .message
                .contains("`a` has no body")
        );
        assert!(handler.updates.is_empty(), "not handed on");
        let held = &subscriptions.get_mut(type_url::CLUSTER).unwrap().held;
        assert_eq!(
            held.iter().collect::<Vec<_>>(),
            [(&"a".to_owned(), &"v1".to_owned())]
        );
    }

    #[tokio::test]
    async fn a_resource_not_subscribed_is_neither_applied_nor_held() {
        let mut handler = Count::default();
        let mut subscriptions = Subscriptions::new(&handler);
        let late = DeltaDiscoveryResponse {
            type_url: type_url::ENDPOINT.into(),
            resources: vec![Envelope {
                name: "gone".into(),
                version: "v1".into(),
                resource: Some(crate::Any::default()),
                ..Default::default()
            }],
            nonce: "1".into(),
            ..Default::default()
        };
        let ack = receive(late, &mut subscriptions, &mut handler)
            .await
            .unwrap();
        assert_eq!(ack.error_detail, None);
        assert!(handler.updates.is_empty());
        let state = subscriptions.get_mut(type_url::ENDPOINT).unwrap();
        assert!(state.held.is_empty());
    }
}
