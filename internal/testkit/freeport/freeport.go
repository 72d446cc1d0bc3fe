// Package freeport picks loopback TCP ports for test servers that must be able to bind the
// same port again after a restart.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// lowest is the smallest port Pick hands out: below it live well-known services.
const lowest = 10000

// ephemeralRangeFile holds the range from which Linux gives ports to outgoing connections
// and to listeners on port 0.
const ephemeralRangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// Pick returns n distinct loopback ports that were free a moment ago. Where the kernel's
// ephemeral range is known and leaves room below it, the ports come from below that range:
// no outgoing connection and no listener on port 0, of this process or any other, is given
// such a port, so it stays free while the server that owns it is down for a restart.
// Elsewhere the kernel picks them (port 0), as it would for any listener. No port is
// handed out twice in a process: tests that run side by side (t.Parallel) never get a
// port that another one has picked and not bound yet, or that its server left for a
// restart.
func Pick(n int) ([]int, error) {
	given.mu.Lock()
	defer given.mu.Unlock()
	// Every listener stays open until all ports are chosen, so none is chosen twice.
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	candidates := belowEphemeral()
	for tries := 0; len(ports) < n; tries++ {
		if tries > 100*n {
			return nil, fmt.Errorf("freeport: found %d of %d free ports", len(ports), n)
		}
		port := 0
		if candidates != nil {
			port = candidates()
		}
		if given.ports[port] {
			continue // this process's already
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			if port == 0 {
				return nil, err
			}
			continue // taken: try another
		}
		lns = append(lns, ln)
		if p := ln.Addr().(*net.TCPAddr).Port; !given.ports[p] {
			ports = append(ports, p)
		}
	}
	for _, p := range ports {
		given.ports[p] = true
	}
	return ports, nil
}

// given holds every port Pick has handed out in this process.
var given = struct {
	mu    sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// TB is the part of testing.TB that MustPick fails through.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// MustPick is Pick for tests: it fails t when no ports can be found.
func MustPick(t TB, n int) []int {
	t.Helper()
	ports, err := Pick(n)
	if err != nil {
		t.Fatalf("free ports: %v", err)
	}
	return ports
}

// Addrs is Pick as "127.0.0.1:PORT" addresses.
func Addrs(n int) ([]string, error) {
	ports, err := Pick(n)
	if err != nil {
		return nil, err
	}
	addrs := make([]string, len(ports))
	for i, p := range ports {
		addrs[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	}
	return addrs, nil
}

// belowEphemeral returns a source of random ports between lowest and the start of the
// kernel's ephemeral range, or nil if that range is unknown or leaves too little room.
func belowEphemeral() func() int {
	start, err := ephemeralStart()
	if err != nil || start-lowest < 1000 {
		return nil
	}
	return func() int { return lowest + rand.IntN(start-lowest) }
}

// ephemeralStart reads the first port of the kernel's ephemeral range.
func ephemeralStart() (int, error) {
	b, err := os.ReadFile(ephemeralRangeFile)
	if err != nil {
		return 0, err
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 0, errors.New("unexpected " + ephemeralRangeFile)
	}
	return strconv.Atoi(fields[0])
}
