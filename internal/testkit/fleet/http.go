package fleet

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"time"
)

// RequestTimeout bounds one request of Do. A stopped process never answers, so it must be
// short.
const RequestTimeout = 2 * time.Second

// Client talks to the processes of a fleet: never through a proxy, never following
// redirects.
var Client = NewClient(true)

// NewClient returns a client like Client; without keepAlive every request has a
// connection of its own, as a one-off curl would.
func NewClient(keepAlive bool) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: RequestTimeout}).DialContext,
			MaxIdleConnsPerHost: 64,
			DisableKeepAlives:   !keepAlive,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Response is the part of an HTTP response that the fleet's users look at.
type Response struct {
	Status int
	Header http.Header
	Body   string
}

// Do sends one request with Client, bounded by RequestTimeout.
func Do(ctx context.Context, method, url string, body []byte) (Response, error) {
	return Send(ctx, Client, method, url, body, RequestTimeout)
}

// Send sends one request with client, bounded by timeout, and reads the whole answer. A
// body is sent as JSON.
func Send(ctx context.Context, client *http.Client, method, url string, body []byte, timeout time.Duration) (Response, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return Response{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return Response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Response{}, err
	}
	return Response{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}, nil
}
