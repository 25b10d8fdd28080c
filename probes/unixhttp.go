package probes

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// A unix_http probe GETs its paths from an HTTP API on a unix socket (a
// guest API such as Incus's /dev/incus) and keeps what each answered:
// what a box is told about itself, and whether it is told about anything
// else, is in the answers. It only reads.

// MaxHTTPBody is how much of each answer a unix_http probe keeps.
const MaxHTTPBody = 16 << 10

func probeUnixHTTP(ctx context.Context, spec ProbeSpec, obs Observation) Observation {
	// One connection for every GET, closed at the end: incusd 6.0 writes
	// its guest API's connection map as a connection opens and closes and
	// reads it unlocked for each request (lxc/incus#3618), so a request on
	// a new connection while the last one's close was still being handled
	// could crash it. On one connection, nothing is written while a
	// request is read.
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", spec.Socket)
		},
		MaxConnsPerHost: 1,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	answered := 0
	var lastErr string
	for _, p := range spec.Paths {
		a := getUnix(ctx, client, p)
		if a.Error == "" {
			answered++
		} else {
			lastErr = a.Error
		}
		obs.Evidence.HTTP = append(obs.Evidence.HTTP, a)
	}
	if answered == 0 {
		if strings.Contains(lastErr, "no such file") {
			return fail(obs, "no socket at "+spec.Socket)
		}
		return fail(obs, spec.Socket+" answered nothing: "+lastErr)
	}
	return done(obs, Reached, fmt.Sprintf("%s answered %d of %d paths", spec.Socket, answered, len(spec.Paths)))
}

func getUnix(ctx context.Context, client *http.Client, path string) HTTPAnswer {
	a := HTTPAnswer{Path: path}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://unix"+path, nil)
	if err != nil {
		a.Error = err.Error()
		return a
	}
	resp, err := client.Do(req)
	if err != nil {
		a.Error = err.Error()
		return a
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxHTTPBody))
	a.Status = resp.StatusCode
	a.Body = printableText(b)
	if err != nil {
		a.Error = "reading the answer: " + err.Error()
	}
	return a
}

// printableText keeps an answer's text as it is, lines and tabs too, with
// anything but printable ASCII as '.'.
func printableText(b []byte) string {
	out := make([]byte, len(b))
	for i, c := range b {
		if c >= 0x20 && c < 0x7f || c == '\n' || c == '\t' {
			out[i] = c
		} else {
			out[i] = '.'
		}
	}
	return string(out)
}
