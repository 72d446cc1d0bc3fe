package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// member is one etcd member. Its name, data dir and ports never change, so
// a restarted member is the same raft member, reachable at the same URL.
type member struct {
	name string
	dir  string
	// clientURL is advertised and owned by the member's front; etcd itself
	// listens on listenURL, which only the front dials.
	clientURL url.URL
	listenURL url.URL
	peerURL   url.URL
	opts      Options

	// op serialises Stop and Restart of this member, so that a restart
	// never races a close that still holds the ports.
	op sync.Mutex

	run *instance // nil while stopped; guarded by Cluster.mu
	// front owns clientURL's port from the first start to the cluster's end, so that
	// a restart never finds it taken.
	front *front
}

// instance is one run of a member, from start to stop.
type instance struct {
	etcd  *embed.Etcd
	front *front // the member's, down once the instance stops
	// closing silences etcd's log once the instance is being stopped.
	closing atomic.Bool
}

// start runs the member with its data dir. frontLn, if not nil, is an open
// listener on clientURL to use for the front; otherwise the front listens
// on clientURL again.
func (m *member) start(initialCluster, state string, frontLn net.Listener) (*instance, error) {
	switch {
	case m.front != nil:
		m.front.up()
	case frontLn != nil:
		m.front = serveFront(frontLn, m.listenURL.Host)
	default:
		ln, err := net.Listen("tcp", m.clientURL.Host)
		if err != nil {
			return nil, fmt.Errorf("listen on client port: %w", err)
		}
		m.front = serveFront(ln, m.listenURL.Host)
	}
	in := &instance{front: m.front}

	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = m.dir
	cfg.ListenClientUrls = []url.URL{m.listenURL}
	cfg.AdvertiseClientUrls = []url.URL{m.clientURL}
	cfg.ListenPeerUrls = []url.URL{m.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{m.peerURL}
	cfg.InitialCluster = initialCluster
	cfg.InitialClusterToken = "etcdtest"
	cfg.ClusterState = state
	if m.opts.TLS != nil {
		cfg.ClientTLSInfo = transport.TLSInfo{
			CertFile:       m.opts.TLS.ServerCertFile,
			KeyFile:        m.opts.TLS.ServerKeyFile,
			TrustedCAFile:  m.opts.TLS.CAFile,
			ClientCertAuth: m.opts.ClientCertAuth,
		}
		if m.opts.ClientCertAuth {
			cfg.ClientTLSInfo.CRLFile = m.opts.TLS.CRLFile
		}
	}
	// Hash passwords with bcrypt's lowest cost: every login checks one, and clients log in
	// again for each stream they open, which at the default cost keeps a race-enabled
	// test's CPU busy for seconds.
	cfg.BcryptCost = 4
	// The members share one machine's disk and a test never outlives its OS, so skipping
	// fsync loses nothing a test looks at, and keeps a slow CI disk from stretching raft
	// round trips into lease renewals.
	cfg.UnsafeNoFsync = true
	if m.opts.AuthTokenTTL > 0 {
		cfg.AuthTokenTTL = uint(m.opts.AuthTokenTTL / time.Second)
	}
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(memberLogger(m.name, &in.closing))

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		in.front.down()
		return nil, err
	}
	in.etcd = e
	return in, nil
}

// stop cuts the member's client connections, then closes etcd and waits
// until its raft loop has exited.
func (in *instance) stop() {
	in.closing.Store(true)
	// Clients lose the member at once, as in a crash. Cutting them first
	// also spares etcd's graceful gRPC stop its wait for open streams.
	in.front.down()
	in.etcd.Close()
	<-in.etcd.Server.StopNotify()
}

// memberLogger logs errors to stderr until closing is set. Embed reports
// its own listeners being closed at shutdown as errors; silencing them
// keeps test output to the errors that matter.
func memberLogger(name string, closing *atomic.Bool) *zap.Logger {
	core := zapcore.NewCore(
		zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()),
		zapcore.Lock(os.Stderr),
		zap.ErrorLevel,
	)
	return zap.New(quietCore{Core: core, closing: closing}).Named("etcdtest." + name)
}

// quietCore drops every entry once closing is set.
type quietCore struct {
	zapcore.Core
	closing *atomic.Bool
}

func (q quietCore) With(fields []zapcore.Field) zapcore.Core {
	return quietCore{Core: q.Core.With(fields), closing: q.closing}
}

func (q quietCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if q.closing.Load() || !q.Enabled(ent.Level) {
		return ce
	}
	return ce.AddCore(ent, q)
}
