package etcdbackend

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/caddyleader/caddy-leader/elector"
)

// Unreachable implements elector.UnreachableClassifier: err means that etcd could not
// answer, rather than that it refused: no member could be reached, the members reached
// have no leader (a lost quorum, an election under way) or the request timed out. Such an
// error may start a failsafe; an answer (lease not found, permission denied, a rewind)
// never does.
func (b *Backend) Unreachable(err error) bool {
	switch etcdErr := rpctypes.Error(err); {
	case errors.Is(err, ErrClosed):
		return false
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(etcdErr, rpctypes.ErrNoLeader),
		errors.Is(etcdErr, rpctypes.ErrTimeout),
		errors.Is(etcdErr, rpctypes.ErrTimeoutDueToLeaderFail),
		errors.Is(etcdErr, rpctypes.ErrTimeoutDueToConnectionLost),
		errors.Is(etcdErr, rpctypes.ErrTimeoutWaitAppliedIndex),
		errors.Is(etcdErr, rpctypes.ErrLeaderChanged):
		return true
	}
	if s, ok := status.FromError(err); ok {
		switch s.Code() {
		case codes.Unavailable, codes.DeadlineExceeded:
			return true
		}
	}
	return false
}

var _ elector.UnreachableClassifier = (*Backend)(nil)
