// Command freeports prints n loopback TCP ports that were free a moment ago, for bench/throughput.sh.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
)

func main() {
	n := flag.Int("n", 1, "how many ports")
	flag.Parse()
	// Every listener stays open until all are chosen, so no port is printed twice.
	var lns []net.Listener
	for range *n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Fprintln(os.Stderr, "freeports:", err)
			os.Exit(1)
		}
		lns = append(lns, ln)
		fmt.Println(ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
}
