//! One incremental stream (`DeltaAggregatedResources`).

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::UnboundedReceiverStream;

use crate::subscription::Subscriptions;
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
    if subscriptions.get_mut(&response.type_url).is_none() {
        tracing::warn!(type_url = %response.type_url, "xDS response of a type not subscribed; ignored");
        return None;
    }
    let versions: Vec<(String, String)> = response
        .resources
        .iter()
        .map(|r| (r.name.clone(), r.version.clone()))
        .collect();
    let mut resources = Vec::with_capacity(response.resources.len());
    let mut missing = None;
    for resource in response.resources {
        match resource.resource {
            Some(value) => resources.push(Resource {
                name: resource.name,
                version: resource.version,
                value,
            }),
            None => missing = Some(resource.name),
        }
    }
    let outcome = match missing {
        Some(name) => Err(format!("resource `{name}` has no body")),
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
