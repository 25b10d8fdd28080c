package probes

import (
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/ndp"
	"github.com/miekg/dns"
)

// listenTCP accepts connections and never answers, like a service that is
// not a greeter.
func listenTCP(addr netip.AddrPort) (func(), error) {
	ln, err := net.Listen("tcp", addr.String())
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	return func() {
		ln.Close()
		<-done
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}, nil
}

// startRAResponder answers router solicitations on the interface holding
// an address in via, advertising prefix (no default route, no SLAAC).
func startRAResponder(t *testing.T, ns *testNS, via, prefix netip.Prefix) func() {
	t.Helper()
	var c *ndp.Conn
	err := ns.Run(func() error {
		ifi, _, err := InterfaceForSubnet(via)
		if err != nil {
			return err
		}
		c, _, err = ndp.Listen(ifi, ndp.LinkLocal)
		return err
	})
	if err != nil {
		t.Fatalf("ra responder: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			m, _, _, err := c.ReadFrom()
			if err != nil {
				return
			}
			if _, ok := m.(*ndp.RouterSolicitation); !ok {
				continue
			}
			ra := &ndp.RouterAdvertisement{Options: []ndp.Option{&ndp.PrefixInformation{
				PrefixLength: uint8(prefix.Bits()), OnLink: true, Prefix: prefix.Addr(),
				ValidLifetime: time.Minute, PreferredLifetime: time.Minute,
			}}}
			_ = c.WriteTo(ra, nil, netip.MustParseAddr("ff02::1"))
		}
	}()
	return func() { c.Close(); <-done }
}

// startDNSServer serves a tiny zone: one public test name (A and PTR), a
// name whose queries are refused, NXDOMAIN for everything else.
func startDNSServer(t *testing.T, ns *testNS, addr netip.AddrPort) {
	t.Helper()
	var pc net.PacketConn
	if err := ns.Run(func() (err error) { pc, err = net.ListenPacket("udp", addr.String()); return err }); err != nil {
		t.Fatalf("dns server: %v", err)
	}
	mux := dns.NewServeMux()
	mux.HandleFunc(".", func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		switch {
		case q.Name == "canary.box.test." && q.Qtype == dns.TypeA:
			rr, _ := dns.NewRR("canary.box.test. 60 IN A 203.0.113.7")
			m.Answer = append(m.Answer, rr)
		case q.Name == "canary.box.test.":
			// NODATA: the name exists, the type does not.
		case q.Name == "7.113.0.203.in-addr.arpa." && q.Qtype == dns.TypePTR:
			rr, _ := dns.NewRR("7.113.0.203.in-addr.arpa. 60 IN PTR canary.box.test.")
			m.Answer = append(m.Answer, rr)
		case q.Name == "refuse.box.test.":
			m.Rcode = dns.RcodeRefused
		default:
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})
	srv := &dns.Server{PacketConn: pc, Handler: mux}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go func() { _ = srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() { _ = srv.Shutdown() })
}
