//! One state-of-the-world stream (`StreamAggregatedResources`).

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::UnboundedReceiverStream;

use crate::subscription::{Subscriptions, TypeState};
use crate::transport::AdsClient;
use crate::{Handler, Node, Resource, StreamError, Update, type_url};

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
        let _ = requests.send(request(state, node.take(), None));
    }
    let mut responses = client
        .stream_aggregated_resources(UnboundedReceiverStream::new(queue))
        .await
        .map_err(|status| (StreamError::Refused(status), false))?
        .into_inner();
    handler.connected(true);
    let mut responded = false;
    loop {
        let response = crate::next_response(&mut responses, responded).await?;
        responded = true;
        let ack = receive(response, subscriptions, handler).await;
        if let Some(ack) = ack {
            crate::send(&requests, ack)?;
        }
        for (type_url, _) in subscriptions.changes(handler) {
            // An empty list of names is a wildcard to a server of the legacy protocol: when
            // the last name goes, nothing is asked, and what the server still sends of the
            // type is not used.
            if let Some(state) = subscriptions
                .get_mut(type_url)
                .filter(|s| s.is_subscribed())
            {
                crate::send(&requests, request(state, None, None))?;
            }
        }
    }
}

/// Hands a response to the handler; returns the ACK or NACK to send.
async fn receive<H: Handler>(
    response: DiscoveryResponse,
    subscriptions: &mut Subscriptions,
    handler: &mut H,
) -> Option<DiscoveryRequest> {
    let Some(state) = subscriptions.get_mut(&response.type_url) else {
        tracing::warn!(type_url = %response.type_url, "xDS response of a type not subscribed; ignored");
        return None;
    };
    let update = Update {
        type_url: response.type_url.clone(),
        complete: type_url::is_wildcard(&response.type_url),
        resources: response
            .resources
            .into_iter()
            .map(|value| Resource {
                name: String::new(),
                version: String::new(),
                value,
            })
            .collect(),
        removed: Vec::new(),
        version_info: response.version_info.clone(),
    };
    state.nonce = response.nonce;
    let outcome = handler.apply(update).await;
    // The handler may have been slow; the state is looked up again (it is the same entry).
    let state = subscriptions.get_mut(&response.type_url)?;
    match outcome {
        Ok(()) => {
            state.accepted_version = response.version_info;
            Some(request(state, None, None))
        }
        Err(reason) => Some(request(state, None, Some(reason))),
    }
}

/// A request for `state`'s type: what it holds (version, last nonce), the names it wants,
/// and the reason if it refuses the last response.
fn request(state: &mut TypeState, node: Option<Node>, error: Option<String>) -> DiscoveryRequest {
    if !state.is_wildcard() && !state.names.is_empty() {
        state.asked = state.names.iter().cloned().collect();
    }
    DiscoveryRequest {
        version_info: state.accepted_version.clone(),
        node,
        resource_names: state.asked.clone(),
        type_url: state.type_url.to_owned(),
        response_nonce: state.nonce.clone(),
        error_detail: error.map(crate::nack_status),
        ..Default::default()
    }
}
