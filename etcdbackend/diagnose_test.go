package etcdbackend

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
)

// closedEndpoint is a loopback host:port that nothing listens on.
func closedEndpoint(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", freeport.MustPick(t, 1)[0])
}

func TestDiagnose(t *testing.T) {
	open, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = open.Close() })
	closed := closedEndpoint(t)
	b, err := New(Config{Endpoints: []string{"http://" + closed, open.Addr().String()}, Prefix: testPrefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })

	t.Run("timeout_names_each_endpoint_and_what_the_dial_met", func(t *testing.T) {
		got := b.Diagnose(t.Context(), fmt.Errorf("grant: %w", context.DeadlineExceeded)).Error()
		for _, want := range []string{
			"endpoint " + closed + ": dial: connect: connection refused",
			"endpoint " + open.Addr().String() + " accepts TCP connections, so the store was slow to answer",
		} {
			if !strings.Contains(got, want) {
				t.Errorf("diagnosis %q does not say %q", got, want)
			}
		}
	})
	t.Run("keeps_the_error_chain", func(t *testing.T) {
		if err := b.Diagnose(t.Context(), context.DeadlineExceeded); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("the diagnosis lost the error: %v", err)
		}
	})
	t.Run("other_errors_say_why_already", func(t *testing.T) {
		in := errors.New("etcdserver: permission denied")
		if err := b.Diagnose(t.Context(), in); err != in {
			t.Errorf("Diagnose changed %v into %v", in, err)
		}
	})
}

// TestUnreachableAtStartIsNamed: with nothing listening on the endpoint, the first WARN a
// candidate logs names the endpoint and "connection refused".
func TestUnreachableAtStartIsNamed(t *testing.T) {
	closed := closedEndpoint(t)
	backend, err := New(Config{Endpoints: []string{closed}, Prefix: testPrefix, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.WarnLevel)
	cand, err := elector.NewCandidate(elector.Config{
		ID: "unreachable", TTL: 2 * time.Second, DrainTimeout: time.Second, Backend: backend, Logger: zap.New(core),
	})
	if err != nil {
		t.Fatal(err)
	}
	cand.Election("diagnose").Start()
	cand.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = cand.Close(ctx)
	})
	waitFor(t, 20*time.Second, "a WARN about the store", func() bool { return logs.FilterMessageSnippet("store request failing").Len() > 0 })
	entry := logs.FilterMessageSnippet("store request failing").All()[0]
	msg, _ := entry.ContextMap()["error"].(string)
	if want := "endpoint " + closed + ": dial: connect: connection refused"; !strings.Contains(msg, want) {
		t.Errorf("the first WARN's error is %q; want it to say %q", msg, want)
	}
}
