package caddyleader

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddyleader/caddy-leader/internal/testkit/goldentest"
)

// goldenAdaptDir holds the golden adapt tests: a Caddyfile, a line `----------`, and either
// the JSON that `caddy adapt --pretty` prints for it or, for a Caddyfile that must not adapt
// (the files named error_*), the error that `caddy adapt` reports.
const goldenAdaptDir = "testdata/caddyfile_adapt"

// setAdaptEnv sets the environment variables that the golden Caddyfiles and
// Caddyfile.example read with {$VAR}; the Caddyfile lexer expands them before parsing.
func setAdaptEnv(t *testing.T) {
	t.Helper()
	t.Setenv("ETCD_ENDPOINTS", "10.0.0.11:2379 10.0.0.12:2379 10.0.0.13:2379")
	t.Setenv("HOSTNAME", "node-a")
	t.Setenv("ADVERTISE_URL", "http://10.0.0.5:8080")
}

func readGolden(t *testing.T, path string) (caddyfileText, expectedJSON string) {
	t.Helper()
	return goldentest.Read(t, path)
}

func adaptCaddyfile(t *testing.T, text string) ([]byte, []caddyconfig.Warning, error) {
	t.Helper()
	return goldentest.Adapt(t, text)
}

func TestCaddyfileAdapt(t *testing.T) {
	setAdaptEnv(t)
	goldentest.RunDir(t, goldenAdaptDir)
}

// TestCaddyfileExample proves that the example users copy adapts, is formatted, and is
// the one pinned by the golden file caddyfile_example.caddyfiletest.
func TestCaddyfileExample(t *testing.T) {
	setAdaptEnv(t)
	data, err := os.ReadFile("Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	example := strings.ReplaceAll(string(data), "\r\n", "\n")
	if _, _, err := adaptCaddyfile(t, example); err != nil {
		t.Fatalf("Caddyfile.example does not adapt: %v", err)
	}
	if w, different := caddyfile.FormattingDifference("Caddyfile.example", []byte(example)); different {
		t.Errorf("Caddyfile.example:%d: not formatted: run `caddy fmt --overwrite Caddyfile.example`", w.Line)
	}
	golden, _ := readGolden(t, filepath.Join(goldenAdaptDir, "caddyfile_example.caddyfiletest"))
	if golden != strings.TrimSpace(example)+"\n" {
		t.Errorf("caddyfile_example.caddyfiletest does not hold Caddyfile.example: copy it over and regenerate the JSON")
	}
}

func TestUnmarshalCaddyfileDispenser(t *testing.T) {
	newApp := func() caddyfile.Unmarshaler { return new(App) }
	newGate := func() caddyfile.Unmarshaler { return new(Gate) }
	newMatcher := func() caddyfile.Unmarshaler { return new(Matcher) }
	tests := []struct {
		name    string
		newMod  func() caddyfile.Unmarshaler
		input   string
		want    caddyfile.Unmarshaler // when wantErr is empty
		wantErr string
	}{
		{
			name:   "app/every_option",
			newMod: newApp,
			input: `leader {
				endpoints 10.0.0.11:2379 https://etcd-2.internal:2379
				endpoints 10.0.0.13:2379
				prefix /fleet-a/
				ttl 15s
				instance_id node-a
				advertise http://10.0.0.5:8080
				dial_timeout 3s
				drain_timeout 1m
				elections main
				elections billing cron
			}`,
			want: &App{
				EtcdStore: EtcdStore{
					Endpoints:   []string{"10.0.0.11:2379", "https://etcd-2.internal:2379", "10.0.0.13:2379"},
					Prefix:      "/fleet-a/",
					DialTimeout: caddy.Duration(3 * time.Second),
				},
				TTL:          caddy.Duration(15 * time.Second),
				InstanceID:   "node-a",
				Advertise:    "http://10.0.0.5:8080",
				DrainTimeout: caddy.Duration(time.Minute),
				Elections:    []string{"main", "billing", "cron"},
			},
		},
		{
			name:   "app/duration_in_days",
			newMod: newApp,
			input:  "leader {\n\tdrain_timeout 1d\n}",
			want:   &App{DrainTimeout: caddy.Duration(24 * time.Hour)},
		},
		{name: "app/argument_after_name", newMod: newApp, input: "leader x {\n}", wantErr: "wrong argument count"},
		{name: "app/unknown_option", newMod: newApp, input: "leader {\n\tlease 10s\n}", wantErr: `unrecognized leader option "lease"`},
		{name: "app/endpoints_without_value", newMod: newApp, input: "leader {\n\tendpoints\n}", wantErr: "endpoints: at least one"},
		{name: "app/elections_without_value", newMod: newApp, input: "leader {\n\telections\n}", wantErr: "wrong argument count"},
		{name: "app/prefix_without_value", newMod: newApp, input: "leader {\n\tprefix\n}", wantErr: "prefix: missing value"},
		{name: "app/instance_id_two_values", newMod: newApp, input: "leader {\n\tinstance_id a b\n}", wantErr: "instance_id: takes exactly one value"},
		{name: "app/ttl_not_a_duration", newMod: newApp, input: "leader {\n\tttl 10\n}", wantErr: `ttl: "10" is not a duration`},
		{name: "app/dial_timeout_without_value", newMod: newApp, input: "leader {\n\tdial_timeout\n}", wantErr: "dial_timeout: missing value"},
		{
			name:   "app/tls_and_login",
			newMod: newApp,
			input: `leader {
				endpoints etcd-1.internal:2379
				tls {
					ca /etc/caddy/etcd/ca.pem
					cert /etc/caddy/etcd/client.pem
					key /etc/caddy/etcd/client-key.pem
					server_name etcd.internal
				}
				username caddy
				password {file./run/secrets/etcd-password}
			}`,
			want: &App{
				EtcdStore: EtcdStore{
					Endpoints: []string{"etcd-1.internal:2379"},
					TLS: &EtcdTLS{
						CA:         "/etc/caddy/etcd/ca.pem",
						Cert:       "/etc/caddy/etcd/client.pem",
						Key:        "/etc/caddy/etcd/client-key.pem",
						ServerName: "etcd.internal",
					},
					Username: "caddy",
					Password: "{file./run/secrets/etcd-password}",
				},
			},
		},
		{name: "app/bare_tls", newMod: newApp, input: "leader {\n\ttls\n}", want: &App{EtcdStore: EtcdStore{TLS: &EtcdTLS{}}}},
		{name: "app/empty_tls_block", newMod: newApp, input: "leader {\n\ttls {\n\t}\n}", want: &App{EtcdStore: EtcdStore{TLS: &EtcdTLS{}}}},
		{name: "app/tls_unknown_option", newMod: newApp, input: "leader {\n\ttls {\n\t\tcafile x\n\t}\n}", wantErr: `unrecognized leader tls option "cafile"`},
		{name: "app/tls_server_name_two_values", newMod: newApp, input: "leader {\n\ttls {\n\t\tserver_name a b\n\t}\n}", wantErr: "server_name: takes exactly one value"},
		{name: "app/tls_cert_without_key", newMod: newApp, input: "leader {\n\ttls {\n\t\tcert c.pem\n\t}\n}", wantErr: "tls.key: the client certificate (tls.cert) needs its private key"},
		{name: "app/username_without_value", newMod: newApp, input: "leader {\n\tusername\n}", wantErr: "username: missing value"},
		{name: "app/password_without_username", newMod: newApp, input: "leader {\n\tpassword x\n}", wantErr: "password: set without a username"},

		{name: "gate/bare", newMod: newGate, input: "leader_gate", want: &Gate{}},
		{name: "gate/election_argument", newMod: newGate, input: "leader_gate billing", want: &Gate{Election: "billing"}},
		{
			name:   "gate/every_subdirective",
			newMod: newGate,
			input: `leader_gate {
				election billing
				follower reject 421
				retry_after 5s
			}`,
			want: &Gate{Election: "billing", Follower: FollowerReject, StatusCode: 421, RetryAfter: caddy.Duration(5 * time.Second)},
		},
		{name: "gate/redirect_308", newMod: newGate, input: "leader_gate {\n\tfollower redirect 308\n}", want: &Gate{Follower: FollowerRedirect, StatusCode: 308}},
		{
			name:   "gate/repeated_follower_forgets_status",
			newMod: newGate,
			input:  "leader_gate {\n\tfollower reject 421\n\tfollower redirect\n}",
			want:   &Gate{Follower: FollowerRedirect},
		},
		{name: "gate/too_many_arguments", newMod: newGate, input: "leader_gate main billing", wantErr: "wrong argument count"},
		{name: "gate/election_twice", newMod: newGate, input: "leader_gate main {\n\telection billing\n}", wantErr: `election: already set to "main"`},
		{name: "gate/election_without_value", newMod: newGate, input: "leader_gate {\n\telection\n}", wantErr: "election: missing value"},
		{name: "gate/follower_without_mode", newMod: newGate, input: "leader_gate {\n\tfollower\n}", wantErr: "wrong argument count"},
		{name: "gate/follower_unknown_mode", newMod: newGate, input: "leader_gate {\n\tfollower drop\n}", wantErr: `follower: "drop" is not one of reject, redirect`},
		{name: "gate/follower_reject_200", newMod: newGate, input: "leader_gate {\n\tfollower reject 200\n}", wantErr: "status_code: 200 is not a 4xx or 5xx"},
		{name: "gate/follower_reject_600", newMod: newGate, input: "leader_gate {\n\tfollower reject 600\n}", wantErr: "status_code: 600"},
		{name: "gate/follower_redirect_302", newMod: newGate, input: "leader_gate {\n\tfollower redirect 302\n}", wantErr: "status_code: 302 is not 307 or 308"},
		{name: "gate/follower_extra_argument", newMod: newGate, input: "leader_gate {\n\tfollower reject 503 now\n}", wantErr: "wrong argument count"},
		{name: "gate/retry_after_not_a_duration", newMod: newGate, input: "leader_gate {\n\tretry_after x\n}", wantErr: `retry_after: "x" is not a duration`},
		{name: "gate/unknown_subdirective", newMod: newGate, input: "leader_gate {\n\tmode reject\n}", wantErr: `unrecognized leader_gate option "mode"`},

		{name: "matcher/bare", newMod: newMatcher, input: "leader", want: &Matcher{}},
		{name: "matcher/election", newMod: newMatcher, input: "leader main", want: &Matcher{Election: "main"}},
		{name: "matcher/repeated_same_election", newMod: newMatcher, input: "leader main\nleader main", want: &Matcher{Election: "main"}},
		{name: "matcher/repeated_default_spelled_out", newMod: newMatcher, input: "leader\nleader default", want: &Matcher{}},
		{name: "matcher/two_elections", newMod: newMatcher, input: "leader main\nleader billing", wantErr: `not both "main" and "billing"`},
		{name: "matcher/extra_argument", newMod: newMatcher, input: "leader main extra", wantErr: "wrong argument count"},
		{name: "matcher/unknown_option", newMod: newMatcher, input: "leader {\n\telection main\n}", wantErr: `unknown option "election"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.newMod()
			err := got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.input))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// newProvisionContext is a Caddy context with no config: enough for Provision, which
// never dials etcd (the backend connects on first use).
func newProvisionContext(t *testing.T) caddy.Context {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	return ctx
}

func TestAppProvisionErrors(t *testing.T) {
	t.Setenv("CADDY_LEADER_TEST_BAD_ENDPOINT", "127.0.0.1:65536")
	tests := []struct {
		name    string
		app     App
		wantErr string
	}{
		{name: "no_endpoints", app: App{}, wantErr: "endpoints: at least one etcd endpoint is required"},
		{name: "endpoint_ftp_scheme", app: App{EtcdStore: EtcdStore{Endpoints: []string{"ftp://x:1"}}}, wantErr: `endpoints: endpoint "ftp://x:1": scheme must be http or https`},
		{name: "endpoint_without_port", app: App{EtcdStore: EtcdStore{Endpoints: []string{"nohostport"}}}, wantErr: `endpoints: endpoint "nohostport" is neither a URL nor host:port`},
		{name: "second_endpoint_bad", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379", "ftp://x:1"}}}, wantErr: `endpoints: endpoint "ftp://x:1"`},
		{name: "ttl_below_minimum", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379"}}, TTL: caddy.Duration(500 * time.Millisecond)}, wantErr: "ttl: 500ms is below the minimum of 1s"},
		{name: "ttl_not_whole_seconds", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379"}}, TTL: caddy.Duration(1500 * time.Millisecond)}, wantErr: "ttl: 1.5s is not a whole number of seconds"},
		{name: "ttl_above_maximum", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379"}}, TTL: caddy.Duration(2 * time.Hour)}, wantErr: "ttl: 2h0m0s is above the maximum of 1h0m0s"},
		{name: "advertise_not_a_url", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379"}}, Advertise: "not a url"}, wantErr: `advertise: "not a url" is not an http:// or https:// URL`},
		{name: "instance_id_with_space", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379"}}, InstanceID: "node a"}, wantErr: `instance_id: "node a" contains white space`},
		{name: "dial_timeout_negative", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: caddy.Duration(-time.Second)}}, wantErr: "dial_timeout: -1s is negative"},
		{name: "drain_timeout_negative", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379"}}, DrainTimeout: caddy.Duration(-time.Second)}, wantErr: "drain_timeout: -1s is negative"},
		{name: "priority_0_with_preempt", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379"}}, Priority: new(0), Preempt: true}, wantErr: "preempt: an instance with priority 0 never leads"},
		{name: "endpoints_with_a_comma", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379,127.0.0.1:2380"}}}, wantErr: "separate endpoints with spaces"},
		{name: "ttl_negative", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379"}}, TTL: caddy.Duration(-time.Second)}, wantErr: "ttl: -1s is below the minimum of 1s"},
		{name: "endpoint_port_out_of_range", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:99999"}}}, wantErr: `endpoints: endpoint "127.0.0.1:99999": port "99999" is not a number from 1 to 65535`},
		{name: "endpoint_url_port_out_of_range", app: App{EtcdStore: EtcdStore{Endpoints: []string{"https://etcd:70000"}}}, wantErr: `endpoints: endpoint "https://etcd:70000": port "70000"`},
		{name: "endpoint_mistyped_scheme", app: App{EtcdStore: EtcdStore{Endpoints: []string{"http//127.0.0.1:2379"}}}, wantErr: `endpoints: endpoint "http//127.0.0.1:2379": host "http//127.0.0.1" is neither a host name nor an IP address`},
		{name: "endpoint_from_placeholder_bad_port", app: App{EtcdStore: EtcdStore{Endpoints: []string{"{env.CADDY_LEADER_TEST_BAD_ENDPOINT}"}}}, wantErr: `endpoints: endpoint "127.0.0.1:65536": port "65536"`},
		{name: "failsafe_without_url_or_advertise", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379"}}, Failsafe: &Failsafe{Listen: ":7444"}}, wantErr: "failsafe: url: not set, and there is no advertise URL to derive it from"},
		{name: "failsafe_listen_without_port", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379"}}, Failsafe: &Failsafe{Listen: "10.0.0.5"}}, wantErr: `failsafe: listen: "10.0.0.5" is not host:port`},
		{name: "failsafe_timeout_a_third_of_ttl", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379"}}, Advertise: "http://10.0.0.5:8080", TTL: caddy.Duration(3 * time.Second), Failsafe: &Failsafe{Listen: ":7444", Timeout: caddy.Duration(time.Second)}}, wantErr: "failsafe: timeout: 1s must be positive and below a third of the ttl (1s)"},
		{name: "advertise_port_out_of_range", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379"}}, Advertise: "http://10.0.0.5:80800"}, wantErr: `advertise: "http://10.0.0.5:80800": port "80800"`},
		{name: "election_name_with_space", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379"}}, Elections: []string{"a b"}}, wantErr: `elections: election name "a b"`},
		{name: "step_down_url_missing", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379"}}, StepDown: &StepDown{}}, wantErr: `step_down_when_unhealthy: url: "" is not an http:// or https:// URL`},
		{name: "step_down_timeout_above_interval", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379"}}, StepDown: &StepDown{URL: "http://127.0.0.1:9000/", Interval: caddy.Duration(time.Second), Timeout: caddy.Duration(2 * time.Second)}}, wantErr: "step_down_when_unhealthy: timeout: 2s must be positive and at most interval (1s)"},
		{name: "step_down_hold_off_below_interval", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379"}}, StepDown: &StepDown{URL: "http://127.0.0.1:9000/", Interval: caddy.Duration(time.Minute), HoldOff: caddy.Duration(time.Second)}}, wantErr: "step_down_when_unhealthy: hold_off: 1s is shorter than interval (1m0s)"},
		{name: "priority_negative", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379"}}, Priority: new(-2)}, wantErr: "priority: -2 is negative (0 never campaigns)"},
		{name: "step_down_fails_negative", app: App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:2379"}}, StepDown: &StepDown{URL: "http://127.0.0.1:9000/", Fails: -1}}, wantErr: "step_down_when_unhealthy: fails: -1 is negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			app := tt.app
			err := app.Provision(newProvisionContext(t))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("got error %v, want one containing %q", err, tt.wantErr)
			}
			if err := app.Cleanup(); err != nil {
				t.Errorf("Cleanup after failed Provision: %v", err)
			}
		})
	}
}

// TestAppProvisionWithoutEtcd is the control for TestAppProvisionErrors: a good app
// provisions with no etcd listening, so those errors come from the fields alone.
func TestAppProvisionWithoutEtcd(t *testing.T) {
	// What `caddy validate` does: provision, validate and clean up through Caddy's own
	// loading path, with nothing listening on the endpoints. The client connects lazily.
	cfg := &caddy.Config{
		Admin: &caddy.AdminConfig{Disabled: true},
		AppsRaw: caddy.ModuleMap{"leader": json.RawMessage(`{
			"endpoints": ["127.0.0.1:1", "http://127.0.0.1:2"],
			"instance_id": "caddyfile-test-node",
			"advertise": "http://10.0.0.5:8080"
		}`)},
	}
	if err := caddy.Validate(cfg); err != nil {
		t.Fatalf("Validate: %v", err)
	}
}

func TestAppDefaults(t *testing.T) {
	app := App{EtcdStore: EtcdStore{Endpoints: []string{"127.0.0.1:1"}}, InstanceID: "node"}
	if err := app.expandAndDefault(); err != nil {
		t.Fatal(err)
	}
	if app.Prefix != DefaultPrefix || time.Duration(app.TTL) != DefaultTTL ||
		time.Duration(app.DialTimeout) != DefaultDialTimeout || time.Duration(app.DrainTimeout) != DefaultDrainTimeout {
		t.Errorf("defaults not filled in: prefix %q, ttl %s, dial_timeout %s, drain_timeout %s",
			app.Prefix, time.Duration(app.TTL), time.Duration(app.DialTimeout), time.Duration(app.DrainTimeout))
	}
}

func TestGateProvisionErrors(t *testing.T) {
	tests := []struct {
		name    string
		gate    Gate
		wantErr string
	}{
		{name: "reject_200", gate: Gate{Follower: FollowerReject, StatusCode: 200}, wantErr: "status_code: 200"},
		{name: "redirect_302", gate: Gate{Follower: FollowerRedirect, StatusCode: 302}, wantErr: "status_code: 302"},
		{name: "unknown_follower", gate: Gate{Follower: "drop"}, wantErr: `follower: "drop"`},
		{name: "election_with_space", gate: Gate{Election: "a b"}, wantErr: "election:"},
		{name: "hold_negative", gate: Gate{Hold: new(caddy.Duration(-time.Second))}, wantErr: "hold: -1s is negative"},
		{name: "retry_after_negative", gate: Gate{RetryAfter: caddy.Duration(-time.Second)}, wantErr: "retry_after: -1s is negative"},
		{name: "without_leader_app", gate: Gate{}, wantErr: "needs the leader app"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := tt.gate
			err := g.Provision(newProvisionContext(t))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("got error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
	t.Run("check_names_status_code", func(t *testing.T) {
		g := Gate{Election: DefaultElection, Follower: FollowerReject, StatusCode: 200}
		if err := g.check(); err == nil || !strings.Contains(err.Error(), "status_code") {
			t.Errorf("got error %v, want one naming status_code", err)
		}
	})
}

func TestMatcherProvisionErrors(t *testing.T) {
	tests := []struct {
		name    string
		matcher Matcher
		wantErr string
	}{
		{name: "election_with_space", matcher: Matcher{Election: "a b"}, wantErr: `election name "a b"`},
		{name: "without_leader_app", matcher: Matcher{}, wantErr: "needs the leader app"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := tt.matcher
			err := m.Provision(newProvisionContext(t))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("got error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestLiteralPasswordWarning: a password written out in the Caddyfile is copied into the
// adapted JSON, so adapting it warns (with the line) and says what to write instead; a
// placeholder Caddy expands at load time does not.
func TestLiteralPasswordWarning(t *testing.T) {
	for _, c := range []struct {
		name, password string
		warn           bool
	}{
		{"literal", "hunter2", true},
		{"env_placeholder", "{env.ETCD_PASSWORD}", false},
		{"file_placeholder", "{file./run/secrets/etcd}", false},
		{"adapt_time_variable_is_already_the_password", "s3cret-from-{$VAR}-expanded", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := literalPasswordWarning("Caddyfile", 7, c.password)
			if c.warn && (!strings.Contains(got, "Caddyfile:7: password is written out") || !strings.Contains(got, "{env.VAR} or {file./path/to/secret}")) {
				t.Errorf("got %q, want a warning with the line that suggests {env.VAR} or {file.…}", got)
			}
			if !c.warn && got != "" {
				t.Errorf("got %q, want no warning", got)
			}
		})
	}
}

// TestUnreadableFileWarning: a tls file that cannot be read where the Caddyfile is adapted
// gets a warning with its line; a readable one or a placeholder does not.
func TestUnreadableFileWarning(t *testing.T) {
	readable := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(readable, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, c := range []struct {
		name, path, want string
	}{
		{"missing", missing, fmt.Sprintf("Caddyfile:5: tls ca: %q cannot be read here (no such file or directory)", missing)},
		{"readable", readable, ""},
		{"placeholder", "{env.ETCD_CA}", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := unreadableFileWarning("Caddyfile", 5, "tls ca", c.path)
			if c.want == "" && got != "" || !strings.Contains(got, c.want) {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

// TestInstanceIDFromHostName pins what docs/recipes.md tells users whose shell does not export
// HOSTNAME: `{$HOSTNAME}` is an environment variable read while adapting (empty when not
// exported), while `{system.hostname}` survives adaptation and is expanded at provisioning.
func TestInstanceIDFromHostName(t *testing.T) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		t.Skipf("host name unknown: %v", err)
	}
	out, _, err := adaptCaddyfile(t, "{\n\tleader {\n\t\tendpoints 127.0.0.1:1\n"+
		"\t\tinstance_id {system.hostname}\n\t\tadvertise http://{system.hostname}:8080\n\t}\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Apps struct {
			Leader App `json:"leader"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	app := cfg.Apps.Leader
	if err := app.expandAndDefault(); err != nil {
		t.Fatal(err)
	}
	if app.InstanceID != host || app.Advertise != "http://"+host+":8080" {
		t.Errorf("instance_id %q, advertise %q; want the host name %q in both", app.InstanceID, app.Advertise, host)
	}
}
