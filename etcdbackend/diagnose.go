package etcdbackend

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/caddyleader/caddy-leader/elector"
)

// Diagnose implements elector.Diagnoser. A request that timed out or found no connection
// says only "context deadline exceeded" or "Unavailable": gRPC keeps redialling behind it and
// does not tell why. Diagnose dials each endpoint once over plain TCP and adds what it met,
// so that the log names the endpoint and the cause ("connection refused": nothing listens
// there; "i/o timeout": a firewall or a host that is down). An endpoint that accepts the
// connection points to what comes after: for a request that timed out, most often a store
// (or a machine) too loaded to answer in time, which passes; when it lasts, TLS,
// authentication, or etcd without quorum.
func (b *Backend) Diagnose(ctx context.Context, err error) error {
	timedOut := errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded
	if !timedOut && status.Code(err) != codes.Unavailable {
		return err // the error says why already
	}
	results := make([]string, len(b.cfg.Endpoints))
	var wg sync.WaitGroup
	for i, ep := range b.cfg.Endpoints {
		wg.Go(func() { results[i] = dialEndpoint(ctx, ep, timedOut) })
	}
	wg.Wait()
	return fmt.Errorf("%w (%s)", err, strings.Join(results, "; "))
}

// dialEndpoint dials ep's host:port once and says what happened, to explain a request that
// timed out (timedOut) or found no connection.
func dialEndpoint(ctx context.Context, ep string, timedOut bool) string {
	hostport := ep
	if u, err := url.Parse(ep); err == nil && strings.Contains(ep, "://") {
		hostport = u.Host
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", hostport)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Err != nil {
			err = op.Err
		}
		return fmt.Sprintf("endpoint %s: dial: %v", hostport, err)
	}
	_ = conn.Close()
	if timedOut {
		return fmt.Sprintf("endpoint %s accepts TCP connections, so the store was slow to answer (a loaded store or machine, if it passes); if it lasts, check TLS, credentials, and that etcd has quorum", hostport)
	}
	return fmt.Sprintf("endpoint %s accepts TCP connections: check TLS, credentials, and that etcd has quorum", hostport)
}

var _ elector.Diagnoser = (*Backend)(nil)
