// Command buildapiserver builds the kube-apiserver the tests run into its cache (see
// kubetest.Build) and prints its path; .ci/run runs it once before the tests.
package main

import (
	"fmt"
	"os"

	"github.com/caddyleader/caddy-leader/kubernetes/internal/kubetest"
)

func main() {
	path, err := kubetest.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(path)
}
