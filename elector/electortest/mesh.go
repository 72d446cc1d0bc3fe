package electortest

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/caddyleader/caddy-leader/elector"
)

// Mesh connects candidates' failsafe endpoints in memory, as their HTTP endpoints would
// be, and lets a test cut the link between two of them.
type Mesh struct {
	mu    sync.Mutex
	nodes map[string]*elector.Candidate
	cut   map[[2]string]bool
	sent  map[string][][]byte // what was asked of each id, oldest first
}

// NewMesh returns an empty mesh.
func NewMesh() *Mesh {
	return &Mesh{nodes: make(map[string]*elector.Candidate), cut: make(map[[2]string]bool), sent: make(map[string][][]byte)}
}

// MeshURL is the failsafe URL of candidate id on a Mesh.
func MeshURL(id string) string { return "mesh://" + id }

// Add makes candidate c reachable as id.
func (m *Mesh) Add(id string, c *elector.Candidate) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nodes[id] = c
}

// Cut breaks (or, with broken false, mends) the link between a and b, both ways.
func (m *Mesh) Cut(a, b string, broken bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cut[[2]string{a, b}] = broken
	m.cut[[2]string{b, a}] = broken
}

// Sent returns every question that reached candidate id so far, oldest first, as a
// man in the middle would have seen them: a test can deliver one again, late.
func (m *Mesh) Sent(id string) [][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([][]byte(nil), m.sent[id]...)
}

// ErrCut is what a question over a cut link fails with.
var ErrCut = errors.New("electortest: link cut")

// From returns the transport with which candidate id asks the others.
func (m *Mesh) From(id string) elector.FailsafeTransport { return meshTransport{m, id} }

type meshTransport struct {
	m    *Mesh
	from string
}

// Ask implements elector.FailsafeTransport.
func (t meshTransport) Ask(ctx context.Context, url string, body []byte) ([]byte, error) {
	to := strings.TrimPrefix(url, "mesh://")
	t.m.mu.Lock()
	c, cut := t.m.nodes[to], t.m.cut[[2]string{t.from, to}]
	if !cut {
		t.m.sent[to] = append(t.m.sent[to], body)
	}
	t.m.mu.Unlock()
	if c == nil || cut {
		return nil, ErrCut
	}
	return c.FailsafeAnswer(ctx, body), nil
}
