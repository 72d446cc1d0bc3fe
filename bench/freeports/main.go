// Command freeports prints n loopback TCP ports that were free a moment ago, for bench/throughput.sh.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
)

func main() {
	n := flag.Int("n", 1, "how many ports")
	flag.Parse()
	ports, err := freeport.Pick(*n)
	if err != nil {
		fmt.Fprintln(os.Stderr, "freeports:", err)
		os.Exit(1)
	}
	for _, p := range ports {
		fmt.Println(p)
	}
}
