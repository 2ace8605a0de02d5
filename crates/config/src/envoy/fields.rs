//! Field numbers and names of the Envoy messages the translation reads, to name a field it
//! does not support (generated from envoy-types' protos).

pub(crate) const LISTENER: &[(u32, &str)] = &[
    (1, "name"),
    (2, "address"),
    (3, "filter_chains"),
    (4, "use_original_dst"),
    (5, "per_connection_buffer_limit_bytes"),
    (6, "metadata"),
    (7, "deprecated_v1"),
    (8, "drain_type"),
    (9, "listener_filters"),
    (10, "transparent"),
    (11, "freebind"),
    (12, "tcp_fast_open_queue_length"),
    (13, "socket_options"),
    (15, "listener_filters_timeout"),
    (16, "traffic_direction"),
    (17, "continue_on_listener_filters_timeout"),
    (18, "udp_listener_config"),
    (19, "api_listener"),
    (20, "connection_balance_config"),
    (21, "reuse_port"),
    (22, "access_log"),
    (24, "tcp_backlog_size"),
    (25, "default_filter_chain"),
    (26, "bind_to_port"),
    (27, "listener_specifier"),
    (28, "stat_prefix"),
    (29, "enable_reuse_port"),
    (30, "enable_mptcp"),
    (31, "ignore_global_conn_limit"),
    (32, "filter_chain_matcher"),
    (33, "additional_addresses"),
    (34, "max_connections_to_accept_per_socket_event"),
    (35, "bypass_overload_manager"),
    (36, "fcds_config"),
    (37, "tcp_keepalive"),
    (38, "per_connection_buffer_high_watermark_timeout"),
    (39, "stats_matcher"),
];

pub(crate) const HTTP1_PROTOCOL_OPTIONS: &[(u32, &str)] = &[
    (1, "allow_absolute_url"),
    (2, "accept_http_10"),
    (3, "default_host_for_http_10"),
    (4, "header_key_format"),
    (5, "enable_trailers"),
    (6, "allow_chunked_length"),
    (7, "override_stream_error_on_invalid_http_message"),
    (8, "send_fully_qualified_url"),
    (9, "use_balsa_parser"),
    (10, "allow_custom_methods"),
    (11, "ignore_http_11_upgrade"),
];

pub(crate) const HTTP_FAULT: &[(u32, &str)] = &[
    (1, "delay"),
    (2, "abort"),
    (3, "upstream_cluster"),
    (4, "headers"),
    (5, "downstream_nodes"),
    (6, "max_active_faults"),
    (7, "response_rate_limit"),
    (8, "delay_percent_runtime"),
    (9, "abort_percent_runtime"),
    (10, "delay_duration_runtime"),
    (11, "abort_http_status_runtime"),
    (12, "max_active_faults_runtime"),
    (13, "response_rate_limit_percent_runtime"),
    (14, "abort_grpc_status_runtime"),
    (15, "disable_downstream_cluster_stats"),
    (16, "filter_metadata"),
];

pub(crate) const FAULT_DELAY: &[(u32, &str)] =
    &[(3, "fixed_delay"), (4, "percentage"), (5, "header_delay")];

pub(crate) const LOCAL_REPLY_CONFIG: &[(u32, &str)] = &[(1, "mappers"), (2, "body_format")];

pub(crate) const RESPONSE_MAPPER: &[(u32, &str)] = &[
    (1, "filter"),
    (2, "status_code"),
    (3, "body"),
    (4, "body_format_override"),
    (5, "headers_to_add"),
];

pub(crate) const LOCAL_RESPONSE_POLICY: &[(u32, &str)] = &[
    (1, "body"),
    (2, "body_format"),
    (3, "status_code"),
    (4, "response_headers_to_add"),
    (5, "preserve_response_code_details"),
    (6, "response_code_details"),
];

pub(crate) const FAULT_ABORT: &[(u32, &str)] = &[
    (2, "http_status"),
    (3, "percentage"),
    (4, "header_abort"),
    (5, "grpc_status"),
    (6, "response_body"),
];

pub(crate) const MAX_STREAM_DURATION: &[(u32, &str)] = &[
    (1, "max_stream_duration"),
    (2, "grpc_timeout_header_max"),
    (3, "grpc_timeout_header_offset"),
];

pub(crate) const KEEPALIVE_SETTINGS: &[(u32, &str)] = &[
    (1, "interval"),
    (2, "timeout"),
    (3, "interval_jitter"),
    (4, "connection_idle_interval"),
];

pub(crate) const ROUTER: &[(u32, &str)] = &[
    (1, "dynamic_stats"),
    (2, "start_child_span"),
    (3, "upstream_log"),
    (4, "suppress_envoy_headers"),
    (5, "strict_check_headers"),
    (6, "respect_expected_rq_timeout"),
    (7, "suppress_grpc_request_failure_code_stats"),
    (8, "upstream_http_filters"),
    (9, "upstream_log_options"),
    (10, "reject_connect_request_early_data"),
];

pub(crate) const PROXY_PROTOCOL: &[(u32, &str)] = &[
    (1, "rules"),
    (2, "allow_requests_without_proxy_protocol"),
    (3, "pass_through_tlvs"),
    (4, "disallowed_versions"),
    (5, "stat_prefix"),
    (6, "tlv_location"),
];

pub(crate) const FILTER_CHAIN_MATCH: &[(u32, &str)] = &[
    (3, "prefix_ranges"),
    (4, "address_suffix"),
    (5, "suffix_len"),
    (6, "source_prefix_ranges"),
    (7, "source_ports"),
    (8, "destination_port"),
    (9, "transport_protocol"),
    (10, "application_protocols"),
    (11, "server_names"),
    (12, "source_type"),
    (13, "direct_source_prefix_ranges"),
];

pub(crate) const FILTER_CHAIN: &[(u32, &str)] = &[
    (1, "filter_chain_match"),
    (3, "filters"),
    (4, "use_proxy_proto"),
    (5, "metadata"),
    (6, "transport_socket"),
    (7, "name"),
    (9, "transport_socket_connect_timeout"),
];

pub(crate) const HTTP_CONNECTION_MANAGER: &[(u32, &str)] = &[
    (1, "codec_type"),
    (2, "stat_prefix"),
    (3, "route_specifier"),
    (4, "route_specifier"),
    (5, "http_filters"),
    (6, "add_user_agent"),
    (7, "tracing"),
    (8, "http_protocol_options"),
    (9, "http2_protocol_options"),
    (10, "server_name"),
    (12, "drain_timeout"),
    (13, "access_log"),
    (14, "use_remote_address"),
    (15, "generate_request_id"),
    (16, "forward_client_cert_details"),
    (17, "set_current_client_cert_details"),
    (18, "proxy_100_continue"),
    (19, "xff_num_trusted_hops"),
    (20, "represent_ipv4_remote_address_as_ipv4_mapped_ipv6"),
    (21, "skip_xff_append"),
    (22, "via"),
    (23, "upgrade_configs"),
    (24, "stream_idle_timeout"),
    (25, "internal_address_config"),
    (26, "delayed_close_timeout"),
    (28, "request_timeout"),
    (29, "max_request_headers_kb"),
    (30, "normalize_path"),
    (31, "route_specifier"),
    (32, "preserve_external_request_id"),
    (33, "merge_slashes"),
    (34, "server_header_transformation"),
    (35, "common_http_protocol_options"),
    (36, "request_id_extension"),
    (37, "always_set_request_id_in_response"),
    (38, "local_reply_config"),
    (39, "strip_matching_host_port"),
    (40, "stream_error_on_invalid_http_message"),
    (41, "request_headers_timeout"),
    (42, "strip_port_mode"),
    (43, "path_normalization_options"),
    (44, "http3_protocol_options"),
    (45, "path_with_escaped_slashes_action"),
    (46, "original_ip_detection_extensions"),
    (47, "strip_trailing_host_dot"),
    (48, "scheme_header_transformation"),
    (49, "proxy_status_config"),
    (50, "typed_header_validation_config"),
    (51, "append_x_forwarded_port"),
    (52, "early_header_mutation_extensions"),
    (53, "add_proxy_protocol_connection_state"),
    (54, "access_log_flush_interval"),
    (55, "flush_access_log_on_new_request"),
    (56, "access_log_options"),
    (57, "append_local_overload"),
    (58, "http1_safe_max_connection_duration"),
    (59, "stream_flush_timeout"),
    (60, "forward_client_cert_matcher"),
    (61, "forward_proto_config"),
    (62, "drain_timeout_jitter"),
];

pub(crate) const ROUTE_CONFIGURATION: &[(u32, &str)] = &[
    (1, "name"),
    (2, "virtual_hosts"),
    (3, "internal_only_headers"),
    (4, "response_headers_to_add"),
    (5, "response_headers_to_remove"),
    (6, "request_headers_to_add"),
    (7, "validate_clusters"),
    (8, "request_headers_to_remove"),
    (9, "vhds"),
    (10, "most_specific_header_mutations_wins"),
    (11, "max_direct_response_body_size_bytes"),
    (12, "cluster_specifier_plugins"),
    (13, "request_mirror_policies"),
    (14, "ignore_port_in_host_matching"),
    (15, "ignore_path_parameters_in_path_matching"),
    (16, "typed_per_filter_config"),
    (17, "metadata"),
    (18, "vhost_header"),
    (19, "route_specifiers"),
];

pub(crate) const VIRTUAL_HOST: &[(u32, &str)] = &[
    (1, "name"),
    (2, "domains"),
    (3, "routes"),
    (4, "require_tls"),
    (5, "virtual_clusters"),
    (6, "rate_limits"),
    (7, "request_headers_to_add"),
    (8, "cors"),
    (10, "response_headers_to_add"),
    (11, "response_headers_to_remove"),
    (13, "request_headers_to_remove"),
    (14, "include_request_attempt_count"),
    (15, "typed_per_filter_config"),
    (16, "retry_policy"),
    (17, "hedge_policy"),
    (18, "per_request_buffer_limit_bytes"),
    (19, "include_attempt_count_in_response"),
    (20, "retry_policy_typed_config"),
    (21, "matcher"),
    (22, "request_mirror_policies"),
    (23, "include_is_timeout_retry_header"),
    (24, "metadata"),
    (25, "request_body_buffer_limit"),
    (26, "route_specifiers"),
];

pub(crate) const ROUTE: &[(u32, &str)] = &[
    (1, "match"),
    (2, "action"),
    (3, "action"),
    (4, "metadata"),
    (5, "decorator"),
    (7, "action"),
    (9, "request_headers_to_add"),
    (10, "response_headers_to_add"),
    (11, "response_headers_to_remove"),
    (12, "request_headers_to_remove"),
    (13, "typed_per_filter_config"),
    (14, "name"),
    (15, "tracing"),
    (16, "per_request_buffer_limit_bytes"),
    (17, "action"),
    (18, "action"),
    (19, "stat_prefix"),
    (20, "request_body_buffer_limit"),
    (21, "route_specifiers"),
];

pub(crate) const ROUTE_MATCH: &[(u32, &str)] = &[
    (1, "path_specifier"),
    (2, "path_specifier"),
    (4, "case_sensitive"),
    (6, "headers"),
    (7, "query_parameters"),
    (8, "grpc"),
    (9, "runtime_fraction"),
    (10, "path_specifier"),
    (11, "tls_context"),
    (12, "path_specifier"),
    (13, "dynamic_metadata"),
    (14, "path_specifier"),
    (15, "path_specifier"),
    (16, "filter_state"),
    (17, "cookies"),
];

pub(crate) const HEADER_MATCHER: &[(u32, &str)] = &[
    (1, "name"),
    (4, "header_match_specifier"),
    (6, "header_match_specifier"),
    (7, "header_match_specifier"),
    (8, "invert_match"),
    (9, "header_match_specifier"),
    (10, "header_match_specifier"),
    (11, "header_match_specifier"),
    (12, "header_match_specifier"),
    (13, "header_match_specifier"),
    (14, "treat_missing_header_as_empty"),
];

pub(crate) const ROUTE_ACTION: &[(u32, &str)] = &[
    (1, "cluster_specifier"),
    (2, "cluster_specifier"),
    (3, "cluster_specifier"),
    (4, "metadata_match"),
    (5, "prefix_rewrite"),
    (6, "host_rewrite_specifier"),
    (7, "host_rewrite_specifier"),
    (8, "timeout"),
    (9, "retry_policy"),
    (11, "priority"),
    (13, "rate_limits"),
    (14, "include_vh_rate_limits"),
    (15, "hash_policy"),
    (17, "cors"),
    (20, "cluster_not_found_response_code"),
    (23, "max_grpc_timeout"),
    (24, "idle_timeout"),
    (25, "upgrade_configs"),
    (26, "internal_redirect_action"),
    (27, "hedge_policy"),
    (28, "grpc_timeout_offset"),
    (29, "host_rewrite_specifier"),
    (30, "request_mirror_policies"),
    (31, "max_internal_redirects"),
    (32, "regex_rewrite"),
    (33, "retry_policy_typed_config"),
    (34, "internal_redirect_policy"),
    (35, "host_rewrite_specifier"),
    (36, "max_stream_duration"),
    (37, "cluster_specifier"),
    (38, "append_x_forwarded_host"),
    (39, "cluster_specifier"),
    (40, "early_data_policy"),
    (41, "path_rewrite_policy"),
    (42, "flush_timeout"),
    (44, "host_rewrite_specifier"),
    (45, "path_rewrite"),
];

pub(crate) const WEIGHTED_CLUSTER: &[(u32, &str)] = &[
    (1, "clusters"),
    (2, "runtime_key_prefix"),
    (3, "total_weight"),
    (4, "random_value_specifier"),
    (5, "random_value_specifier"),
];

pub(crate) const CLUSTER_WEIGHT: &[(u32, &str)] = &[
    (1, "name"),
    (2, "weight"),
    (3, "metadata_match"),
    (4, "request_headers_to_add"),
    (5, "response_headers_to_add"),
    (6, "response_headers_to_remove"),
    (9, "request_headers_to_remove"),
    (10, "typed_per_filter_config"),
    (11, "host_rewrite_specifier"),
    (12, "cluster_header"),
];

pub(crate) const INTERNAL_REDIRECT_POLICY: &[(u32, &str)] = &[
    (1, "max_internal_redirects"),
    (2, "redirect_response_codes"),
    (3, "predicates"),
    (4, "allow_cross_scheme_redirect"),
    (5, "response_headers_to_copy"),
];

pub(crate) const REQUEST_MIRROR_POLICY: &[(u32, &str)] = &[
    (1, "cluster"),
    (3, "runtime_fraction"),
    (4, "trace_sampled"),
    (5, "cluster_header"),
    (6, "disable_shadow_host_suffix_append"),
];

pub(crate) const REDIRECT_ACTION: &[(u32, &str)] = &[
    (1, "host_redirect"),
    (2, "path_rewrite_specifier"),
    (3, "response_code"),
    (4, "scheme_rewrite_specifier"),
    (5, "path_rewrite_specifier"),
    (6, "strip_query"),
    (7, "scheme_rewrite_specifier"),
    (8, "port_redirect"),
    (9, "path_rewrite_specifier"),
    (10, "path_rewrite_specifier"),
];

pub(crate) const QUERY_PARAMETER_MATCHER: &[(u32, &str)] = &[
    (1, "name"),
    (5, "query_parameter_match_specifier"),
    (6, "query_parameter_match_specifier"),
];

pub(crate) const RETRY_POLICY: &[(u32, &str)] = &[
    (1, "retry_on"),
    (2, "num_retries"),
    (3, "per_try_timeout"),
    (4, "retry_priority"),
    (5, "retry_host_predicate"),
    (6, "host_selection_retry_max_attempts"),
    (7, "retriable_status_codes"),
    (8, "retry_back_off"),
    (9, "retriable_headers"),
    (10, "retriable_request_headers"),
    (11, "rate_limited_retry_back_off"),
    (12, "retry_options_predicates"),
    (13, "per_try_idle_timeout"),
    (14, "refresh_cluster_on_retry"),
];

pub(crate) const DIRECT_RESPONSE_ACTION: &[(u32, &str)] =
    &[(1, "status"), (2, "body"), (3, "body_format")];

pub(crate) const CLUSTER: &[(u32, &str)] = &[
    (1, "name"),
    (2, "cluster_discovery_type"),
    (3, "eds_cluster_config"),
    (4, "connect_timeout"),
    (5, "per_connection_buffer_limit_bytes"),
    (6, "lb_policy"),
    (8, "health_checks"),
    (9, "max_requests_per_connection"),
    (10, "circuit_breakers"),
    (13, "http_protocol_options"),
    (14, "http2_protocol_options"),
    (16, "dns_refresh_rate"),
    (17, "dns_lookup_family"),
    (18, "dns_resolvers"),
    (19, "outlier_detection"),
    (20, "cleanup_interval"),
    (21, "upstream_bind_config"),
    (22, "lb_subset_config"),
    (23, "lb_config"),
    (24, "transport_socket"),
    (25, "metadata"),
    (26, "protocol_selection"),
    (27, "common_lb_config"),
    (28, "alt_stat_name"),
    (29, "common_http_protocol_options"),
    (30, "upstream_connection_options"),
    (31, "close_connections_on_host_health_failure"),
    (32, "ignore_health_on_host_removal"),
    (33, "load_assignment"),
    (34, "lb_config"),
    (36, "typed_extension_protocol_options"),
    (37, "lb_config"),
    (38, "cluster_discovery_type"),
    (39, "respect_dns_ttl"),
    (40, "filters"),
    (41, "load_balancing_policy"),
    (42, "lrs_server"),
    (43, "transport_socket_matches"),
    (44, "dns_failure_refresh_rate"),
    (45, "use_tcp_for_dns_lookups"),
    (46, "upstream_http_protocol_options"),
    (47, "track_timeout_budgets"),
    (48, "upstream_config"),
    (49, "track_cluster_stats"),
    (50, "preconnect_policy"),
    (51, "connection_pool_per_downstream_connection"),
    (52, "lb_config"),
    (53, "dns_resolution_config"),
    (54, "wait_for_warm_on_init"),
    (55, "typed_dns_resolver_config"),
    (56, "lb_config"),
    (57, "lrs_report_endpoint_metrics"),
    (58, "dns_jitter"),
    (59, "transport_socket_matcher"),
    (60, "per_connection_buffer_high_watermark_timeout"),
    (61, "stats_matcher"),
    (62, "queuing_policies"),
];

pub(crate) const CIRCUIT_BREAKERS: &[(u32, &str)] =
    &[(1, "thresholds"), (2, "per_host_thresholds")];

pub(crate) const THRESHOLDS: &[(u32, &str)] = &[
    (1, "priority"),
    (2, "max_connections"),
    (3, "max_pending_requests"),
    (4, "max_requests"),
    (5, "max_retries"),
    (6, "track_remaining"),
    (7, "max_connection_pools"),
    (8, "retry_budget"),
];

pub(crate) const OUTLIER_DETECTION: &[(u32, &str)] = &[
    (1, "consecutive_5xx"),
    (2, "interval"),
    (3, "base_ejection_time"),
    (4, "max_ejection_percent"),
    (5, "enforcing_consecutive_5xx"),
    (6, "enforcing_success_rate"),
    (7, "success_rate_minimum_hosts"),
    (8, "success_rate_request_volume"),
    (9, "success_rate_stdev_factor"),
    (10, "consecutive_gateway_failure"),
    (11, "enforcing_consecutive_gateway_failure"),
    (12, "split_external_local_origin_errors"),
    (13, "consecutive_local_origin_failure"),
    (14, "enforcing_consecutive_local_origin_failure"),
    (15, "enforcing_local_origin_success_rate"),
    (16, "failure_percentage_threshold"),
    (17, "enforcing_failure_percentage"),
    (18, "enforcing_failure_percentage_local_origin"),
    (19, "failure_percentage_minimum_hosts"),
    (20, "failure_percentage_request_volume"),
    (21, "max_ejection_time"),
    (22, "max_ejection_time_jitter"),
    (23, "successful_active_health_check_uneject_host"),
    (24, "monitors"),
    (25, "always_eject_one_host"),
    (26, "detect_degraded_hosts"),
];

pub(crate) const TRANSPORT_SOCKET_MATCH: &[(u32, &str)] =
    &[(1, "name"), (2, "match"), (3, "transport_socket")];

pub(crate) const CLUSTER_LOAD_ASSIGNMENT: &[(u32, &str)] = &[
    (1, "cluster_name"),
    (2, "endpoints"),
    (4, "policy"),
    (5, "named_endpoints"),
];

pub(crate) const LOCALITY_LB_ENDPOINTS: &[(u32, &str)] = &[
    (1, "locality"),
    (2, "lb_endpoints"),
    (3, "load_balancing_weight"),
    (5, "priority"),
    (6, "proximity"),
    (7, "lb_config"),
    (8, "lb_config"),
    (9, "metadata"),
];

pub(crate) const LB_ENDPOINT: &[(u32, &str)] = &[
    (1, "host_identifier"),
    (2, "health_status"),
    (3, "metadata"),
    (4, "load_balancing_weight"),
    (5, "host_identifier"),
];

pub(crate) const ENDPOINT: &[(u32, &str)] = &[
    (1, "address"),
    (2, "health_check_config"),
    (3, "hostname"),
    (4, "additional_addresses"),
    (5, "observability_name"),
];

pub(crate) const ENDPOINT_HEALTH_CHECK_CONFIG: &[(u32, &str)] = &[
    (1, "port_value"),
    (2, "hostname"),
    (3, "address"),
    (4, "disable_active_health_check"),
];

pub(crate) const HEALTH_CHECK: &[(u32, &str)] = &[
    (1, "timeout"),
    (2, "interval"),
    (3, "interval_jitter"),
    (4, "unhealthy_threshold"),
    (5, "healthy_threshold"),
    (6, "alt_port"),
    (7, "reuse_connection"),
    (8, "health_checker"),
    (9, "health_checker"),
    (11, "health_checker"),
    (12, "no_traffic_interval"),
    (13, "health_checker"),
    (14, "unhealthy_interval"),
    (15, "unhealthy_edge_interval"),
    (16, "healthy_edge_interval"),
    (17, "event_log_path"),
    (18, "interval_jitter_percent"),
    (19, "always_log_health_check_failures"),
    (20, "initial_jitter"),
    (21, "tls_options"),
    (22, "event_service"),
    (23, "transport_socket_match_criteria"),
    (24, "no_traffic_healthy_interval"),
    (25, "event_logger"),
    (26, "always_log_health_check_success"),
];

pub(crate) const GRPC_HEALTH_CHECK: &[(u32, &str)] = &[
    (1, "service_name"),
    (2, "authority"),
    (3, "initial_metadata"),
];

pub(crate) const HTTP_HEALTH_CHECK: &[(u32, &str)] = &[
    (1, "host"),
    (2, "path"),
    (3, "send"),
    (4, "receive"),
    (6, "request_headers_to_add"),
    (8, "request_headers_to_remove"),
    (9, "expected_statuses"),
    (10, "codec_client_type"),
    (11, "service_name_matcher"),
    (12, "retriable_statuses"),
    (13, "method"),
    (14, "response_buffer_size"),
];

pub(crate) const SOCKET_ADDRESS: &[(u32, &str)] = &[
    (1, "protocol"),
    (2, "address"),
    (3, "port_specifier"),
    (4, "port_specifier"),
    (5, "resolver_name"),
    (6, "ipv4_compat"),
    (7, "network_namespace_filepath"),
];

pub(crate) const TRACK_CLUSTER_STATS: &[(u32, &str)] = &[
    (1, "timeout_budgets"),
    (2, "request_response_sizes"),
    (3, "per_endpoint_stats"),
];

pub(crate) const PRECONNECT_POLICY: &[(u32, &str)] = &[
    (1, "per_upstream_preconnect_ratio"),
    (2, "predictive_preconnect_ratio"),
    (3, "preconnect_enabled_metadata"),
];

pub(crate) const UPSTREAM_CONNECTION_OPTIONS: &[(u32, &str)] = &[
    (1, "tcp_keepalive"),
    (2, "set_local_interface_name_on_upstream_connections"),
    (3, "happy_eyeballs_config"),
];

pub(crate) const HTTP_PROTOCOL_OPTIONS: &[(u32, &str)] = &[
    (1, "idle_timeout"),
    (2, "max_headers_count"),
    (3, "max_connection_duration"),
    (4, "max_stream_duration"),
    (5, "headers_with_underscores_action"),
    (6, "max_requests_per_connection"),
    (7, "max_response_headers_kb"),
    (8, "max_connection_duration_jitter"),
];

/// `envoy.extensions.upstreams.http.v3.HttpProtocolOptions` (a cluster's).
pub(crate) const UPSTREAM_HTTP_PROTOCOL_OPTIONS: &[(u32, &str)] = &[
    (1, "common_http_protocol_options"),
    (2, "upstream_http_protocol_options"),
    (3, "explicit_http_config"),
    (4, "use_downstream_protocol_config"),
    (5, "auto_config"),
    (6, "http_filters"),
    (7, "header_validation_config"),
    (8, "outlier_detection"),
    (9, "request_mirror_policies"),
    (10, "hash_policy"),
    (11, "retry_policy"),
];

pub(crate) const HTTP2_PROTOCOL_OPTIONS: &[(u32, &str)] = &[
    (1, "hpack_table_size"),
    (2, "max_concurrent_streams"),
    (3, "initial_stream_window_size"),
    (4, "initial_connection_window_size"),
    (5, "allow_connect"),
    (6, "allow_metadata"),
    (7, "max_outbound_frames"),
    (8, "max_outbound_control_frames"),
    (9, "max_consecutive_inbound_frames_with_empty_payload"),
    (10, "max_inbound_priority_frames_per_stream"),
    (11, "max_inbound_window_update_frames_per_data_frame_sent"),
    (12, "stream_error_on_invalid_http_messaging"),
    (13, "custom_settings_parameters"),
    (14, "override_stream_error_on_invalid_http_message"),
    (15, "connection_keepalive"),
    (16, "use_oghttp2_codec"),
    (17, "max_metadata_size"),
    (18, "enable_huffman_encoding"),
    (19, "max_header_field_size_kb"),
    (20, "disallow_obs_text"),
    (21, "stream_reset_burst"),
    (22, "stream_reset_rate"),
];

pub(crate) const DOWNSTREAM_TLS_CONTEXT: &[(u32, &str)] = &[
    (1, "common_tls_context"),
    (2, "require_client_certificate"),
    (3, "require_sni"),
    (4, "session_ticket_keys_type"),
    (5, "session_ticket_keys_type"),
    (6, "session_timeout"),
    (7, "session_ticket_keys_type"),
    (8, "ocsp_staple_policy"),
    (9, "full_scan_certs_on_sni_mismatch"),
    (10, "disable_stateful_session_resumption"),
    (11, "prefer_client_ciphers"),
];

pub(crate) const UPSTREAM_TLS_CONTEXT: &[(u32, &str)] = &[
    (1, "common_tls_context"),
    (2, "sni"),
    (3, "allow_renegotiation"),
    (4, "max_session_keys"),
    (5, "enforce_rsa_key_usage"),
    (6, "auto_host_sni"),
    (7, "auto_sni_san_validation"),
];

pub(crate) const COMMON_TLS_CONTEXT: &[(u32, &str)] = &[
    (1, "tls_params"),
    (2, "tls_certificates"),
    (3, "validation_context_type"),
    (4, "alpn_protocols"),
    (6, "tls_certificate_sds_secret_configs"),
    (7, "validation_context_type"),
    (8, "validation_context_type"),
    (9, "tls_certificate_certificate_provider"),
    (10, "validation_context_type"),
    (11, "tls_certificate_certificate_provider_instance"),
    (12, "validation_context_type"),
    (13, "custom_handshaker"),
    (14, "tls_certificate_provider_instance"),
    (15, "key_log"),
    (16, "custom_tls_certificate_selector"),
];

pub(crate) const TLS_CERTIFICATE: &[(u32, &str)] = &[
    (1, "certificate_chain"),
    (2, "private_key"),
    (3, "password"),
    (4, "ocsp_staple"),
    (5, "signed_certificate_timestamp"),
    (6, "private_key_provider"),
    (7, "watched_directory"),
    (8, "pkcs12"),
    (9, "tls_params"),
];

pub(crate) const CERTIFICATE_VALIDATION_CONTEXT: &[(u32, &str)] = &[
    (1, "trusted_ca"),
    (2, "verify_certificate_hash"),
    (3, "verify_certificate_spki"),
    (6, "require_signed_certificate_timestamp"),
    (7, "crl"),
    (8, "allow_expired_certificate"),
    (9, "match_subject_alt_names"),
    (10, "trust_chain_verification"),
    (11, "watched_directory"),
    (12, "custom_validator_config"),
    (13, "ca_certificate_provider_instance"),
    (14, "only_verify_leaf_cert_crl"),
    (15, "match_typed_subject_alt_names"),
    (16, "max_verify_depth"),
    (17, "system_root_certs"),
    (18, "suppress_client_ca_list"),
];

pub(crate) const TLS_PARAMETERS: &[(u32, &str)] = &[
    (1, "tls_minimum_protocol_version"),
    (2, "tls_maximum_protocol_version"),
    (3, "cipher_suites"),
    (4, "ecdh_curves"),
    (5, "signature_algorithms"),
    (6, "compliance_policies"),
];

/// The names of the fields set in `rest` (what is left of a message once the supported fields
/// are taken out), by `names`; a number when the table does not know it.
pub(crate) fn set_fields(rest: &impl prost::Message, names: &[(u32, &str)]) -> Vec<String> {
    let bytes = rest.encode_to_vec();
    let mut found: Vec<String> = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let Some((key, used)) = varint(&bytes[at..]) else {
            break;
        };
        at += used;
        let number = (key >> 3) as u32;
        let skip = match key & 7 {
            0 => varint(&bytes[at..]).map(|(_, used)| used),
            1 => Some(8),
            2 => varint(&bytes[at..]).map(|(len, used)| used + len as usize),
            5 => Some(4),
            _ => None,
        };
        let name = names
            .iter()
            .find(|(n, _)| *n == number)
            .map_or_else(|| format!("field {number}"), |(_, name)| (*name).to_owned());
        if !found.contains(&name) {
            found.push(name);
        }
        match skip {
            Some(skip) => at += skip,
            None => break,
        }
    }
    found
}

fn varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

pub(crate) const LOCAL_RATE_LIMIT: &[(u32, &str)] = &[
    (1, "stat_prefix"),
    (2, "status"),
    (3, "token_bucket"),
    (4, "filter_enabled"),
    (5, "filter_enforced"),
    (6, "response_headers_to_add"),
    (8, "descriptors"),
    (9, "stage"),
    (10, "request_headers_to_add_when_not_enforced"),
    (11, "local_rate_limit_per_downstream_connection"),
    (12, "enable_x_ratelimit_headers"),
    (13, "vh_rate_limits"),
    (14, "always_consume_default_token_bucket"),
    (15, "rate_limited_as_resource_exhausted"),
    (16, "local_cluster_rate_limit"),
    (17, "rate_limits"),
    (18, "max_dynamic_descriptors"),
    (19, "enable_retry_after_header"),
];

pub(crate) const RATE_LIMIT: &[(u32, &str)] = &[
    (1, "stage"),
    (2, "disable_key"),
    (3, "actions"),
    (4, "limit"),
    (5, "hits_addend"),
    (6, "apply_on_stream_done"),
    (7, "x_ratelimit_option"),
];

pub(crate) const COMMON_LB_CONFIG: &[(u32, &str)] = &[
    (1, "healthy_panic_threshold"),
    (2, "zone_aware_lb_config"),
    (3, "locality_weighted_lb_config"),
    (4, "update_merge_window"),
    (5, "ignore_new_hosts_until_first_hc"),
    (6, "close_connections_on_host_set_change"),
    (7, "consistent_hashing_lb_config"),
    (8, "override_host_status"),
];

pub(crate) const ROUND_ROBIN: &[(u32, &str)] =
    &[(1, "slow_start_config"), (2, "locality_lb_config")];

pub(crate) const LEAST_REQUEST: &[(u32, &str)] = &[
    (1, "choice_count"),
    (2, "active_request_bias"),
    (3, "slow_start_config"),
    (4, "locality_lb_config"),
    (5, "enable_full_scan"),
    (6, "selection_method"),
];

pub(crate) const RANDOM: &[(u32, &str)] = &[(1, "locality_lb_config")];

pub(crate) const RING_HASH: &[(u32, &str)] = &[
    (1, "hash_function"),
    (2, "minimum_ring_size"),
    (3, "maximum_ring_size"),
    (4, "use_hostname_for_hashing"),
    (5, "hash_balance_factor"),
    (6, "consistent_hashing_lb_config"),
    (7, "locality_weighted_lb_config"),
];

pub(crate) const MAGLEV: &[(u32, &str)] = &[
    (1, "table_size"),
    (2, "consistent_hashing_lb_config"),
    (3, "locality_weighted_lb_config"),
];

pub(crate) const DNS_CLUSTER: &[(u32, &str)] = &[
    (3, "dns_refresh_rate"),
    (4, "dns_failure_refresh_rate"),
    (5, "respect_dns_ttl"),
    (6, "dns_jitter"),
    (7, "typed_dns_resolver_config"),
    (8, "dns_lookup_family"),
    (9, "all_addresses_in_single_endpoint"),
    (10, "dns_min_refresh_rate"),
];

pub(crate) const TCP_HEALTH_CHECK: &[(u32, &str)] =
    &[(1, "send"), (2, "receive"), (3, "proxy_protocol_config")];

pub(crate) const TCP_PROXY: &[(u32, &str)] = &[
    (1, "stat_prefix"),
    (2, "cluster_specifier"),
    (3, "downstream_idle_timeout"),
    (4, "upstream_idle_timeout"),
    (5, "access_log"),
    (7, "max_connect_attempts"),
    (8, "idle_timeout"),
    (9, "metadata_match"),
    (10, "cluster_specifier"),
    (11, "hash_policy"),
    (12, "tunneling_config"),
    (13, "max_downstream_connection_duration"),
    (14, "on_demand"),
    (15, "access_log_flush_interval"),
    (16, "flush_access_log_on_connected"),
    (17, "access_log_options"),
    (18, "backoff_options"),
    (19, "proxy_protocol_tlvs"),
    (20, "max_downstream_connection_duration_jitter_percentage"),
    (21, "upstream_connect_mode"),
    (22, "max_early_data_bytes"),
    (23, "proxy_protocol_tlv_merge_policy"),
    (24, "check_drain_close"),
];

pub(crate) const UDP_LISTENER_CONFIG: &[(u32, &str)] = &[
    (5, "downstream_socket_config"),
    (7, "quic_options"),
    (8, "udp_packet_packet_writer_config"),
];

pub(crate) const QUIC_LISTENER_OPTIONS: &[(u32, &str)] = &[
    (1, "quic_protocol_options"),
    (2, "idle_timeout"),
    (3, "crypto_handshake_timeout"),
    (4, "enabled"),
    (5, "packets_to_read_to_connection_count_ratio"),
    (6, "crypto_stream_config"),
    (7, "proof_source_config"),
    (8, "connection_id_generator_config"),
    (9, "server_preferred_address_config"),
    (10, "send_disable_active_migration"),
    (11, "connection_debug_visitor_config"),
    (12, "save_cmsg_config"),
    (13, "reject_new_connections"),
    (14, "max_sessions_per_event_loop"),
];

pub(crate) const QUIC_PROTOCOL_OPTIONS: &[(u32, &str)] = &[
    (1, "max_concurrent_streams"),
    (2, "initial_stream_window_size"),
    (3, "initial_connection_window_size"),
    (4, "num_timeouts_to_trigger_port_migration"),
    (5, "connection_keepalive"),
    (6, "connection_options"),
    (7, "client_connection_options"),
    (8, "idle_network_timeout"),
    (9, "max_packet_length"),
    (10, "client_packet_writer"),
    (11, "connection_migration"),
    (12, "memory_reduction_timeout"),
    (13, "enable_scone"),
];

pub(crate) const HTTP3_PROTOCOL_OPTIONS: &[(u32, &str)] = &[
    (1, "quic_protocol_options"),
    (2, "override_stream_error_on_invalid_http_message"),
    (5, "allow_extended_connect"),
    (6, "allow_metadata"),
    (7, "disable_qpack"),
    (8, "disable_connection_flow_control_for_streams"),
    (9, "disallow_obs_text"),
];

pub(crate) const UDP_SOCKET_CONFIG: &[(u32, &str)] =
    &[(1, "max_rx_datagram_size"), (2, "prefer_gro")];

pub(crate) const QUIC_DOWNSTREAM_TRANSPORT: &[(u32, &str)] = &[
    (1, "downstream_tls_context"),
    (2, "enable_early_data"),
    (3, "enable_resumption"),
];
