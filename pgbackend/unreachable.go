package pgbackend

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/caddyleader/caddy-leader/elector"
)

// Unreachable implements elector.UnreachableClassifier: err means that PostgreSQL could
// not be reached or dropped the connection (refused, reset, timed out, shutting down,
// not yet accepting connections), rather than that it answered. Such an error may start
// a failsafe; an answer (a failed compare, a lease not found, a rewind, a permission or
// SQL error) never does. An error whose message had to be redacted of a password lost
// its cause, and counts as an answer: the safe side.
func (b *Backend) Unreachable(err error) bool {
	if errors.Is(err, ErrClosed) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// Class 08 is a connection exception; 57P01-57P03 a server shutting down,
		// crashed, or not accepting connections yet.
		return strings.HasPrefix(pgErr.Code, "08") || pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03"
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) || pgconn.Timeout(err) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

var _ elector.UnreachableClassifier = (*Backend)(nil)
