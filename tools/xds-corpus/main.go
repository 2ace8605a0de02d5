// xds-corpus serves each scenario of a corpus of xDS outputs (Envoy Gateway's translator
// golden files: NAME.{listeners,routes,clusters,endpoints,secrets}.yaml, YAML renderings of
// v3 resources) from go-control-plane's ADS server to a real proxy, Legate or Envoy, one
// scenario at a time, and reports per resource type whether the proxy ACKed or NACKed it
// (with the NACK's reason). Listener addresses are rewritten to 127.0.0.1 and endpoint
// addresses to 127.0.0.1 before serving, so no traffic leaves the machine.
//
//	go run . -corpus DIR -proxy legate=target/release/legate -proxy envoy=/path/to/envoy \
//	    [-mode sotw|delta] [-only REGEX] [-json report.json]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tls "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	server "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

const nodeID = "corpus"

// kinds in the order a proxy asks for them; the file suffix and the type URL of each.
var kinds = []struct {
	file, url, short string
	new              func() proto.Message
}{
	{"clusters", resource.ClusterType, "cds", func() proto.Message { return &cluster.Cluster{} }},
	{"endpoints", resource.EndpointType, "eds", func() proto.Message { return &endpoint.ClusterLoadAssignment{} }},
	{"listeners", resource.ListenerType, "lds", func() proto.Message { return &listener.Listener{} }},
	{"routes", resource.RouteType, "rds", func() proto.Message { return &route.RouteConfiguration{} }},
	{"secrets", resource.SecretType, "sds", func() proto.Message { return &tls.Secret{} }},
}

type scenario struct {
	name      string
	resources map[string][]types.Resource // by type URL
	names     []string                    // every resource name, to take out of reasons
}

// outcome of one type for one proxy: "ack", "nack", "not asked" (the proxy never asked for
// it, or was never sent it), "no answer" (sent, neither ACKed nor NACKed).
type outcome struct {
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
}

type result struct {
	Scenario string             `json:"scenario"`
	Proxy    string             `json:"proxy"`
	Types    map[string]outcome `json:"types"`
	Whole    bool               `json:"accepted_whole"`
	Error    string             `json:"error,omitempty"`
}

type proxyFlag []string

func (p *proxyFlag) String() string     { return strings.Join(*p, ",") }
func (p *proxyFlag) Set(v string) error { *p = append(*p, v); return nil }

func main() {
	var proxies proxyFlag
	corpus := flag.String("corpus", "", "folder of NAME.{listeners,routes,clusters,endpoints,secrets}.yaml")
	flag.Var(&proxies, "proxy", "NAME=PATH of a proxy binary (legate or envoy); repeat for both")
	mode := flag.String("mode", "sotw", "sotw or delta")
	only := flag.String("only", "", "regular expression: only the scenarios whose name matches")
	quiet := flag.Duration("quiet", 1500*time.Millisecond, "a scenario ends when every type is answered, or after this long without a request")
	deadline := flag.Duration("deadline", 20*time.Second, "the longest one scenario may take")
	jsonOut := flag.String("json", "", "write every result to this file")
	verbose := flag.Bool("v", false, "print each scenario's outcome")
	flag.Parse()
	if *corpus == "" || len(proxies) == 0 || (*mode != "sotw" && *mode != "delta") {
		flag.Usage()
		os.Exit(2)
	}
	filter := regexp.MustCompile(*only)
	scenarios, err := loadCorpus(*corpus, filter)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var results []result
	for _, p := range proxies {
		name, path, ok := strings.Cut(p, "=")
		if !ok || (name != "legate" && name != "envoy") {
			fmt.Fprintf(os.Stderr, "-proxy %q: expected legate=PATH or envoy=PATH\n", p)
			os.Exit(2)
		}
		for _, sc := range scenarios {
			r := runScenario(sc, name, path, *mode, *quiet, *deadline)
			if *verbose {
				fmt.Printf("%-8s %-60s whole=%v %s\n", name, sc.name, r.Whole, brief(r))
			}
			results = append(results, r)
		}
	}
	report(os.Stdout, scenarios, results, proxies)
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(results, "", "  ")
		if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
}

func brief(r result) string {
	if r.Error != "" {
		return "error: " + r.Error
	}
	var parts []string
	for _, k := range kinds {
		if o, ok := r.Types[k.short]; ok {
			s := k.short + ":" + o.Status
			if o.Reason != "" {
				s += " (" + o.Reason + ")"
			}
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, " ")
}

func loadCorpus(dir string, filter *regexp.Regexp) ([]scenario, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var names []string
	for _, e := range entries {
		base, ok := strings.CutSuffix(e.Name(), ".yaml")
		if !ok {
			continue
		}
		i := strings.LastIndex(base, ".")
		if i < 0 {
			continue
		}
		n := base[:i]
		if !seen[n] && filter.MatchString(n) {
			seen[n] = true
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var out []scenario
	for _, n := range names {
		sc := scenario{name: n, resources: map[string][]types.Resource{}}
		for _, k := range kinds {
			raw, err := os.ReadFile(filepath.Join(dir, n+"."+k.file+".yaml"))
			if os.IsNotExist(err) {
				continue
			} else if err != nil {
				return nil, err
			}
			js, err := yaml.YAMLToJSON(raw)
			if err != nil {
				return nil, fmt.Errorf("%s.%s: %v", n, k.file, err)
			}
			var items []json.RawMessage
			if err := json.Unmarshal(js, &items); err != nil {
				return nil, fmt.Errorf("%s.%s: %v", n, k.file, err)
			}
			for i, item := range items {
				m := k.new()
				if err := protojson.Unmarshal(item, m); err != nil {
					return nil, fmt.Errorf("%s.%s[%d]: %v", n, k.file, i, err)
				}
				rewriteAddresses(m)
				sc.resources[k.url] = append(sc.resources[k.url], m.(types.Resource))
				sc.names = append(sc.names, cache.GetResourceName(m.(types.Resource)))
			}
		}
		out = append(out, sc)
	}
	return out, nil
}

// rewriteAddresses keeps every address the proxy binds or connects to on loopback.
func rewriteAddresses(m proto.Message) {
	loopback := func(a *core.Address, host string) {
		if sa := a.GetSocketAddress(); sa != nil {
			sa.Address = host
			sa.Ipv4Compat = false
		}
	}
	endpoints := func(cla *endpoint.ClusterLoadAssignment) {
		for _, l := range cla.GetEndpoints() {
			for _, e := range l.GetLbEndpoints() {
				if ep := e.GetEndpoint(); ep != nil {
					if ep.Address != nil {
						loopback(ep.Address, "127.0.0.1")
					}
					for _, extra := range ep.AdditionalAddresses {
						if extra.Address != nil {
							loopback(extra.Address, "127.0.0.1")
						}
					}
				}
			}
		}
	}
	switch r := m.(type) {
	case *listener.Listener:
		if r.Address != nil {
			loopback(r.Address, "127.0.0.1")
		}
		// Two addresses of one port ("0.0.0.0" and "::") become two loopback addresses.
		for i, extra := range r.AdditionalAddresses {
			if extra.Address != nil {
				loopback(extra.Address, fmt.Sprintf("127.0.0.%d", i+2))
			}
		}
	case *cluster.Cluster:
		if r.LoadAssignment != nil {
			endpoints(r.LoadAssignment)
		}
	case *endpoint.ClusterLoadAssignment:
		endpoints(r)
	}
}

// tracker records what the proxy was sent and how it first answered, per type; lastSeen is
// when the last of those happened (zero until the first response is sent).
type tracker struct {
	mu       sync.Mutex
	sent     map[string]bool
	answer   map[string]outcome
	lastSeen time.Time
	changed  chan struct{}
}

func newTracker() *tracker {
	return &tracker{sent: map[string]bool{}, answer: map[string]outcome{}, changed: make(chan struct{}, 1)}
}

func (t *tracker) poke() {
	select {
	case t.changed <- struct{}{}:
	default:
	}
}

func (t *tracker) request(url, nonce string, errDetail string, isNack bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if nonce == "" || !t.sent[url] {
		return
	}
	// The first answer of a type counts: after a NACK the server sends the same snapshot
	// again and the proxy NACKs it again, as often as it is sent.
	if _, done := t.answer[url]; !done {
		if isNack {
			t.answer[url] = outcome{Status: "nack", Reason: errDetail}
		} else {
			t.answer[url] = outcome{Status: "ack"}
		}
		t.lastSeen = time.Now()
		t.poke()
	}
}

func (t *tracker) response(url string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.sent[url] {
		t.sent[url] = true
		t.lastSeen = time.Now()
		t.poke()
	}
}

func runScenario(sc scenario, proxyName, proxyPath, mode string, quiet, deadline time.Duration) result {
	res := result{Scenario: sc.name, Proxy: proxyName, Types: map[string]outcome{}}
	t := newTracker()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	snapshotCache := cache.NewSnapshotCache(true, cache.IDHash{}, nil)
	snap, err := cache.NewSnapshot("1", sc.resources)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	if err := snapshotCache.SetSnapshot(ctx, nodeID, snap); err != nil {
		res.Error = err.Error()
		return res
	}
	callbacks := server.CallbackFuncs{
		StreamRequestFunc: func(_ int64, r *discovery.DiscoveryRequest) error {
			t.request(r.TypeUrl, r.ResponseNonce, r.GetErrorDetail().GetMessage(), r.ErrorDetail != nil)
			return nil
		},
		StreamResponseFunc: func(_ context.Context, _ int64, _ *discovery.DiscoveryRequest, r *discovery.DiscoveryResponse) {
			t.response(r.TypeUrl)
		},
		StreamDeltaRequestFunc: func(_ int64, r *discovery.DeltaDiscoveryRequest) error {
			t.request(r.TypeUrl, r.ResponseNonce, r.GetErrorDetail().GetMessage(), r.ErrorDetail != nil)
			return nil
		},
		StreamDeltaResponseFunc: func(_ int64, _ *discovery.DeltaDiscoveryRequest, r *discovery.DeltaDiscoveryResponse) {
			t.response(r.TypeUrl)
		},
	}
	srv := server.NewServer(ctx, snapshotCache, callbacks)
	grpcServer := grpc.NewServer()
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(grpcServer, srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		res.Error = err.Error()
		return res
	}
	go func() { _ = grpcServer.Serve(lis) }()
	defer grpcServer.Stop()
	adsPort := lis.Addr().(*net.TCPAddr).Port

	dir, err := os.MkdirTemp("", "xds-corpus-")
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer os.RemoveAll(dir)
	cmd, err := startProxy(proxyName, proxyPath, dir, adsPort, mode)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	exited := make(chan struct{})
	waited := exited
	go func() { _ = cmd.Wait(); close(waited) }()
	defer stopProxy(cmd, waited)

	end := time.Now().Add(deadline)
	for {
		t.mu.Lock()
		answered := true
		for url, rs := range sc.resources {
			if len(rs) == 0 {
				continue
			}
			if _, ok := t.answer[url]; !ok {
				answered = false
			}
		}
		// Quiet counts from the first response sent: a proxy slow to start is waited for.
		idle := !t.lastSeen.IsZero() && time.Since(t.lastSeen) > quiet
		t.mu.Unlock()
		if answered || idle || time.Now().After(end) {
			break
		}
		select {
		case <-t.changed:
		case <-exited:
			res.Error = "the proxy exited; its log: " + tail(filepath.Join(dir, "log"))
			exited = nil
			end = time.Now()
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	res.Whole = res.Error == ""
	for _, k := range kinds {
		if len(sc.resources[k.url]) == 0 {
			continue
		}
		o, ok := t.answer[k.url]
		if !ok {
			if t.sent[k.url] {
				o = outcome{Status: "no answer"}
			} else {
				o = outcome{Status: "not asked"}
			}
		}
		if o.Status != "ack" {
			res.Whole = false
		}
		res.Types[k.short] = o
	}
	return res
}

func startProxy(name, path, dir string, adsPort int, mode string) (*exec.Cmd, error) {
	cfg := filepath.Join(dir, "bootstrap.yaml")
	var body string
	var args []string
	switch name {
	case "legate":
		body = fmt.Sprintf(`node: { id: %s, cluster: corpus }
admin: { address: "127.0.0.1:0" }
dynamic_resources:
  ads: { address: "127.0.0.1:%d", protocol: %s }
`, nodeID, adsPort, mode)
		args = []string{"--config", cfg}
	case "envoy":
		apiType := "GRPC"
		if mode == "delta" {
			apiType = "DELTA_GRPC"
		}
		body = fmt.Sprintf(`node: { id: %s, cluster: corpus }
admin: { address: { socket_address: { address: 127.0.0.1, port_value: 0 } } }
dynamic_resources:
  ads_config:
    api_type: %s
    transport_api_version: V3
    grpc_services: [{ envoy_grpc: { cluster_name: xds } }]
  cds_config: { ads: {}, resource_api_version: V3 }
  lds_config: { ads: {}, resource_api_version: V3 }
static_resources:
  clusters:
  - name: xds
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http2_protocol_options: {} }
    load_assignment:
      cluster_name: xds
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: %d } } } }] }]
`, nodeID, apiType, adsPort)
		args = []string{"-c", cfg, "--disable-hot-restart", "--concurrency", "1", "--log-level", "warn"}
	}
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Env = append(os.Environ(), "RUST_LOG=warn")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return cmd, nil
}

// stopProxy ends the proxy it started, at once: nothing it holds needs a graceful end.
func stopProxy(cmd *exec.Cmd, exited <-chan struct{}) {
	_ = cmd.Process.Kill()
	<-exited
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	s := strings.TrimSpace(string(b))
	if len(s) > 400 {
		s = "…" + s[len(s)-400:]
	}
	return s
}

var (
	quoted  = regexp.MustCompile(`"[^"]*"`)
	numbers = regexp.MustCompile(`\b\d+\b`)
)

// reasonKey groups NACK reasons: resource names, quoted values and numbers taken out.
func reasonKey(reason string, names []string) string {
	sort.Slice(names, func(i, j int) bool { return len(names[i]) > len(names[j]) })
	for _, n := range names {
		if n != "" {
			reason = strings.ReplaceAll(reason, n, "NAME")
		}
	}
	reason = quoted.ReplaceAllString(reason, `"…"`)
	reason = numbers.ReplaceAllString(reason, "N")
	if len(reason) > 220 {
		reason = reason[:220] + "…"
	}
	return reason
}

var notSupported = regexp.MustCompile(`not supported: ([^(]*)`)

// refusedFields reads the field names out of Legate's "not supported: a, b (…)" reasons.
func refusedFields(reason string) []string {
	var out []string
	for _, m := range notSupported.FindAllStringSubmatch(reason, -1) {
		for _, f := range strings.Split(m[1], ",") {
			if f = strings.TrimSpace(f); f != "" {
				out = append(out, f)
			}
		}
	}
	return out
}

func report(w *os.File, scenarios []scenario, results []result, proxies []string) {
	names := map[string][]string{}
	for _, sc := range scenarios {
		names[sc.name] = append([]string(nil), sc.names...)
	}
	for _, p := range proxies {
		proxy, _, _ := strings.Cut(p, "=")
		whole := 0
		perType := map[string][2]int{}
		reasons := map[string]int{}
		fields := map[string]int{}
		var errors []string
		for _, r := range results {
			if r.Proxy != proxy {
				continue
			}
			if r.Whole {
				whole++
			}
			if r.Error != "" {
				errors = append(errors, r.Scenario+": "+r.Error)
			}
			for typ, o := range r.Types {
				c := perType[typ]
				c[1]++
				if o.Status == "ack" {
					c[0]++
				}
				perType[typ] = c
				key := o.Status
				if o.Status == "nack" {
					key = typ + " nack: " + reasonKey(o.Reason, names[r.Scenario])
					for _, f := range refusedFields(o.Reason) {
						fields[typ+" "+f]++
					}
				} else if o.Status != "ack" {
					key = typ + " " + o.Status
				} else {
					continue
				}
				reasons[key]++
			}
		}
		fmt.Fprintf(w, "\n== %s: %d of %d scenarios accepted whole\n", proxy, whole, len(scenarios))
		for _, k := range kinds {
			if c, ok := perType[k.short]; ok {
				fmt.Fprintf(w, "   %s: %d of %d scenarios ACKed\n", k.short, c[0], c[1])
			}
		}
		type kv struct {
			k string
			v int
		}
		var sorted []kv
		for k, v := range reasons {
			sorted = append(sorted, kv{k, v})
		}
		sort.Slice(sorted, func(i, j int) bool {
			if sorted[i].v != sorted[j].v {
				return sorted[i].v > sorted[j].v
			}
			return sorted[i].k < sorted[j].k
		})
		fmt.Fprintf(w, "   refusals, grouped (scenarios):\n")
		for _, e := range sorted {
			fmt.Fprintf(w, "   %4d  %s\n", e.v, e.k)
		}
		var byField []kv
		for k, v := range fields {
			byField = append(byField, kv{k, v})
		}
		sort.Slice(byField, func(i, j int) bool {
			if byField[i].v != byField[j].v {
				return byField[i].v > byField[j].v
			}
			return byField[i].k < byField[j].k
		})
		if len(byField) > 0 {
			fmt.Fprintf(w, "   fields named as not supported (scenarios):\n")
		}
		for _, e := range byField {
			fmt.Fprintf(w, "   %4d  %s\n", e.v, e.k)
		}
		for _, e := range errors {
			fmt.Fprintf(w, "   error: %s\n", e)
		}
	}
}
