package testenv

import (
	"fmt"
	"strings"
)

// BootProbeInit is a PID 1 for a box of the probe image that starts, from
// the box's boot on and before the image's own init (which the test
// moves to /sbin/init.orig), a loop that every 100 ms asks the canary
// named name at addr for a page over HTTP and the gateway's resolver for
// the name resolve, and writes each try to /probe.log (emptied at each
// boot): when it began (seconds since the kernel's boot), whether the
// resolver answered, and the first line of the HTTP answer. It is how a
// test proves what a box could reach from its first frame on.
func BootProbeInit(name, addr, resolve string) string {
	return fmt.Sprintf(`#!/bin/sh
# box tests: a boot probe (internal/testenv/bootprobe.go), then the image's init.
: > /probe.log
(while :; do
	t=$(cut -d' ' -f1 /proc/uptime)
	gw=$(ip -4 route show default 2>/dev/null | cut -d' ' -f3)
	dns=FAIL; [ -n "$gw" ] && nslookup %[3]s "$gw" >/dev/null 2>&1 && dns=ok
	out=$(printf 'GET / HTTP/1.0\r\nHost: %[1]s\r\n\r\n' | nc -w 1 %[2]s 80 2>/dev/null | head -1)
	echo "$t dns=$dns $out" >> /probe.log
	sleep 0.1
done) </dev/null >/dev/null 2>&1 &
exec /sbin/init.orig
`, name, addr, resolve)
}

// BootProbe is what a box's boot probe wrote.
type BootProbe struct {
	// Tries it made; Reached of them got the canary's greeting, Refused an
	// HTTP 403 (box's egress proxy), Resolved an answer of the resolver.
	Tries, Reached, Refused, Resolved int
}

// ReadBootProbe reads /probe.log's lines against the canary's greeting.
func ReadBootProbe(log, greeting string) BootProbe {
	var p BootProbe
	for _, l := range strings.Split(strings.TrimSpace(log), "\n") {
		f := strings.SplitN(l, " ", 3)
		if len(f) < 2 {
			continue
		}
		p.Tries++
		if f[1] == "dns=ok" {
			p.Resolved++
		}
		answer := ""
		if len(f) == 3 {
			answer = strings.TrimSpace(f[2])
		}
		switch {
		case answer == greeting:
			p.Reached++
		case strings.HasPrefix(answer, "HTTP/1.1 403"):
			p.Refused++
		}
	}
	return p
}

func (p BootProbe) String() string {
	return fmt.Sprintf("%d tries: %d reached the canary, %d refused by box's proxy, %d resolved by the gateway", p.Tries, p.Reached, p.Refused, p.Resolved)
}
