package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestPick(t *testing.T) {
	ports, err := Pick(20)
	if err != nil {
		t.Fatal(err)
	}
	start, rangeErr := ephemeralStart()
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("port %d picked twice in %v", p, ports)
		}
		seen[p] = true
		if rangeErr == nil && start-lowest >= 1000 && (p < lowest || p >= start) {
			t.Errorf("port %d is outside [%d, %d), below the ephemeral range", p, lowest, start)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("picked port %d cannot be bound: %v", p, err)
		}
		ln.Close()
	}
}

// TestPickNeverTwice: ports handed out by earlier calls are not handed out again, whether
// or not their servers bound them meanwhile. 400 ports drawn at random from the ~20,000
// below the ephemeral range would repeat one almost surely (the birthday bound).
func TestPickNeverTwice(t *testing.T) {
	seen := map[int]bool{}
	for range 40 {
		ports, err := Pick(10)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ports {
			if seen[p] {
				t.Fatalf("port %d handed out twice", p)
			}
			seen[p] = true
		}
	}
}
