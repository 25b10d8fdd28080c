// Command egressbench runs inside a box for scripts/egress-bench.sh: the
// latency of DNS answers from the box's gateway, and the throughput of one
// HTTP download.
//
//	egressbench dns GATEWAY NAME N      p50 and p99 of N answers, in microseconds,
//	                                    asked 10 ms apart (box's resolver takes
//	                                    100 questions a second from a box)
//	egressbench get ADDR:PORT HOST PATH bytes, seconds and MB/s of one GET
//	egressbench udp ADDR:PORT TEXT      one datagram, and the reply or "no reply"
package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/miekg/dns"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "egressbench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	switch {
	case len(args) == 4 && args[0] == "dns":
		n, err := strconv.Atoi(args[3])
		if err != nil {
			return err
		}
		return lookups(args[1], args[2], n)
	case len(args) == 4 && args[0] == "get":
		return get(args[1], args[2], args[3])
	case len(args) == 3 && args[0] == "udp":
		return datagram(args[1], args[2])
	}
	return fmt.Errorf("usage: egressbench dns GATEWAY NAME N | get ADDR:PORT HOST PATH | udp ADDR:PORT TEXT")
}

// lookups asks the same question n times, one after the other (the
// answers come from the resolvers' caches after the first), over one
// socket as a stub resolver would.
func lookups(gw, name string, n int) error {
	c := &dns.Client{Timeout: 2 * time.Second}
	conn, err := c.Dial(net.JoinHostPort(gw, "53"))
	if err != nil {
		return err
	}
	defer conn.Close()
	var took []time.Duration
	for i := 0; i < n; i++ {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		r, rtt, err := c.ExchangeWithConn(m, conn)
		if err != nil {
			return err
		}
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
			return fmt.Errorf("%s: %s", name, dns.RcodeToString[r.Rcode])
		}
		took = append(took, rtt)
		time.Sleep(10 * time.Millisecond)
	}
	slices.Sort(took)
	q := func(p float64) float64 { return float64(took[int(p*float64(len(took)-1))].Microseconds()) }
	fmt.Printf("dns %s n=%d p50_us=%.0f p99_us=%.0f\n", name, n, q(0.50), q(0.99))
	return nil
}

// get downloads path from addr with Host host and discards the body.
func get(addr, host, path string) error {
	t0 := time.Now()
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, host)
	br := bufio.NewReaderSize(c, 1<<16)
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			return fmt.Errorf("response head: %w", err)
		}
		if l == "\r\n" {
			break
		}
	}
	n, err := io.Copy(io.Discard, br)
	if err != nil {
		return err
	}
	s := time.Since(t0).Seconds()
	fmt.Printf("get %s bytes=%d seconds=%.3f mb_per_s=%.1f\n", host, n, s, float64(n)/s/1e6)
	return nil
}

// datagram sends text to addr and prints the reply (a second at most).
func datagram(addr, text string) error {
	c, err := net.Dial("udp4", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write([]byte(text)); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	b := make([]byte, 1500)
	n, err := c.Read(b)
	if err != nil {
		fmt.Println("no reply")
		return nil
	}
	fmt.Printf("reply: %s\n", b[:n])
	return nil
}
