package caddyleader

import (
	"fmt"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddyleader/caddy-leader/shards"
)

// shardKey is where a request's shard key comes from: any text with placeholders, read
// through Caddy's replacer, except for the common single placeholders (a header, a path
// segment, a query value), which are read straight from the request without allocating.
type shardKey struct {
	raw   string
	kind  keyKind
	name  string // the canonical header name, or the query parameter
	index int    // the path segment
}

type keyKind int

const (
	keyReplacer keyKind = iota
	keyHeader
	keyPathSegment
	keyQuery
)

// parseShardKey prepares the key text raw; it must have at least one placeholder, or every
// request would go to one shard.
func parseShardKey(raw string) (shardKey, error) {
	if !strings.Contains(raw, "{") {
		return shardKey{}, fmt.Errorf("key %q has no placeholder: every request would fall into one shard; use one such as {http.request.header.X-Tenant} or {http.request.uri.path.1}", raw)
	}
	if err := checkKeyPlaceholders(raw); err != nil {
		return shardKey{}, err
	}
	k := shardKey{raw: raw}
	name, ok := strings.CutPrefix(raw, "{")
	if !ok || !strings.HasSuffix(name, "}") || strings.ContainsAny(name[:len(name)-1], "{}") {
		return k, nil
	}
	name = name[:len(name)-1]
	switch {
	case strings.HasPrefix(name, "http.request.header."):
		k.kind, k.name = keyHeader, textproto.CanonicalMIMEHeaderKey(strings.TrimPrefix(name, "http.request.header."))
	case strings.HasPrefix(name, "http.request.uri.path."):
		i, err := strconv.Atoi(strings.TrimPrefix(name, "http.request.uri.path."))
		if err != nil || i < 0 {
			return k, nil
		}
		k.kind, k.index = keyPathSegment, i
	case strings.HasPrefix(name, "http.request.uri.query."):
		k.kind, k.name = keyQuery, strings.TrimPrefix(name, "http.request.uri.query.")
	}
	return k, nil
}

// keyNamespaces are the placeholder namespaces that resolve while a request is routed:
// Caddy's HTTP replacer's, the variables and matches that handlers and matchers set before
// the gate, and Caddy's global ones. Any other expands to nothing (or to itself), and then
// every request falls into one shard.
var keyNamespaces = []string{
	"http.request.", "http.vars.", "http.auth.", "http.regexp.", "http.matchers.", "http.error.",
	"env.", "system.", "time.",
}

// requestPlaceholders are the first names under http.request. that Caddy's HTTP replacer
// knows, so that a misspelt one (`{http.request.heders.X}`) is refused as well.
var requestPlaceholders = []string{
	"body", "body_base64", "client_ip", "cookie", "duration", "duration_ms", "header", "host", "hostport",
	"local", "method", "orig_method", "orig_uri", "port", "proto", "proto_name", "remote",
	"scheme", "tls", "uri", "uri_escaped", "uuid",
}

// checkKeyPlaceholders refuses a key whose braces do not pair up or one of whose
// placeholders no replacer resolves for a request: either would put every request in one
// shard without a word.
func checkKeyPlaceholders(raw string) error {
	for i := 0; i < len(raw); i++ {
		switch raw[i] {
		case '\\':
			i++ // an escaped brace is text
		case '}':
			return fmt.Errorf("key %q has a `}` that closes no placeholder", raw)
		case '{':
			end := strings.IndexAny(raw[i+1:], "{}")
			if end < 0 || raw[i+1+end] == '{' {
				return fmt.Errorf("key %q has a `{` that is not closed: write each placeholder as {name}", raw)
			}
			if name := raw[i+1 : i+1+end]; !knownKeyPlaceholder(name) {
				return fmt.Errorf("key %q: placeholder {%s} is not one that resolves for a request (such as {http.request.header.<name>}, {http.request.uri.path.<n>}, {http.request.uri.query.<name>}, {http.vars.<name>} or {env.<name>}), so every request would fall into one shard", raw, name)
			}
			i += end + 1
		}
	}
	return nil
}

// knownKeyPlaceholder reports whether the placeholder name is in a namespace that
// resolves for a request.
func knownKeyPlaceholder(name string) bool {
	if sub, ok := strings.CutPrefix(name, "http.request."); ok {
		first, _, _ := strings.Cut(sub, ".")
		return slices.Contains(requestPlaceholders, first)
	}
	for _, ns := range keyNamespaces {
		if strings.HasPrefix(name, ns) && len(name) > len(ns) {
			return true
		}
	}
	return false
}

// of returns r's key, as Caddy's replacer would expand raw for r.
func (k shardKey) of(r *http.Request, repl *caddy.Replacer) string {
	switch k.kind {
	case keyHeader:
		if v := r.Header[k.name]; len(v) == 1 {
			return v[0]
		}
	case keyPathSegment:
		return pathSegment(r.URL.Path, k.index)
	case keyQuery:
		if v, ok := plainQueryValue(r.URL.RawQuery, k.name); ok {
			return v
		}
	}
	return repl.ReplaceAll(k.raw, "")
}

// shard returns r's shard in a set of count shards.
func (k shardKey) shard(r *http.Request, repl *caddy.Replacer, count int) int {
	return shards.Of(k.of(r, repl), count)
}

// requestShard is shard with r's own replacer, or a new one for a request that did not
// come through Caddy's HTTP server.
func (k shardKey) requestShard(r *http.Request, count int) int {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		repl = caddy.NewReplacer()
	}
	return k.shard(r, repl, count)
}

// pathSegment is segment i of path, counted from 0 after the leading slash, as Caddy's
// {http.request.uri.path.i} gives it; "" when there are fewer.
func pathSegment(path string, i int) string {
	path = strings.TrimPrefix(path, "/")
	for ; i > 0; i-- {
		slash := strings.IndexByte(path, '/')
		if slash < 0 {
			return ""
		}
		path = path[slash+1:]
	}
	if slash := strings.IndexByte(path, '/'); slash >= 0 {
		return path[:slash]
	}
	return path
}

// plainQueryValue finds the value of parameter name in query when neither needs decoding
// and it appears once; otherwise it reports false and the replacer decides.
func plainQueryValue(query, name string) (string, bool) {
	if strings.ContainsAny(query, "%+;") {
		return "", false
	}
	value, found := "", false
	for query != "" {
		var pair string
		pair, query, _ = strings.Cut(query, "&")
		key, v, _ := strings.Cut(pair, "=")
		if key != name {
			continue
		}
		if found {
			return "", false // several values: the replacer joins them
		}
		value, found = v, true
	}
	return value, true
}
