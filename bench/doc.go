// Package bench holds caddy-leader's long benchmarks (build tag bench) and the scripts that run them; see BENCHMARKS.md.
package bench
