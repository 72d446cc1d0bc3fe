package caddyleader

import (
	"fmt"
	"net/http"
	"net/textproto"
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
