// Package probes fires raw L2/L3/DNS/IPv6 probes (forged ones among
// them), runs witnesses (passive captures at a probe's target) and
// listeners, and holds the in-box agent that reads a JSON plan and writes
// JSON observations. It knows nothing about Incus: the drill pushes the
// agent into a box and reads its report.
//
// # Outcomes
//
// Every probe, witness and listener yields an Observation whose Outcome is
// one of five values. No value carries two meanings, because the original
// tool's worst bug was reading "refused" and "no route" as one number.
//
//	reached   the target answered and proved it was the target: it echoed
//	          the probe's nonce (TCP, UDP, ICMP, broadcast), answered the ARP
//	          request for its own address, or (DNS) the resolver returned
//	          records for the name. For a witness: a matching frame arrived.
//	          For a listener: at least one peer was served.
//	refused   the packet arrived at the target's address, and something
//	          there answered without proof: a TCP RST, ICMP port-unreachable
//	          sent by the target itself, a TCP handshake without the nonce
//	          echo, a UDP reply without the nonce, a DNS reply without
//	          records (NXDOMAIN, NODATA, REFUSED, SERVFAIL: evidence.dns.rcode).
//	rejected  something other than the target's own stack said no: ICMP
//	          admin-prohibited from anyone, or any ICMP unreachable from an
//	          address that is not the target (an nft "reject" in a router).
//	          evidence.icmp names the offender, type and code.
//	silent    nothing came back before the deadline (or only our own stack
//	          gave up, e.g. no ARP reply for an on-link target). For the
//	          forging probes, which expect nothing: every packet left.
//	error     the probe could not run, or its answer cannot be classified
//	          without guessing (reason says why). Never a verdict.
//
// Outcome.Arrived (reached, refused) and Outcome.Stopped (rejected,
// silent) are the two sides an isolation claim cares about. "Blocked" is
// Stopped at the sender and silent at the target's witness.
//
// How refused and rejected are told apart: UDP and DNS probes use a
// connected socket with IP_RECVERR and read each ICMP error's type, code and
// offender from the error queue; TCP probes bind their source port before
// the SYN leaves and match ICMP errors that quote it on a raw ICMP socket;
// ICMP echo probes match errors that quote their own echo id. A
// port-unreachable from the target is refused; the same from a router is
// rejected.
//
// A UDP probe to a well-known port (53, 5353, 67, 69, 123, 137, 161, 1900)
// sends a minimal valid request of that port's protocol, since a real
// server ignores a bare nonce line; evidence.request names what was sent
// (udpproto.go has the table, and what in each reply proves it answers
// this probe; "payload" in the plan overrides the choice). A TCP probe
// reports its source port and its SYN's initial sequence number
// (evidence.src_port, evidence.isn, learned best effort from a capture of
// the SYN leaving), which a witness past a NAT can match.
//
// Known limitation: an nft "reject with tcp reset" in a middle box forges
// the RST with the target's address, so the sender reads refused. The
// target's witness saw nothing, and a verdict that needs both (arrived at
// the sender, seen at the target) exposes it.
//
// # Forging probes
//
// Claim C-SPOOF (a box cannot take another's identity) uses four probes
// that expect no answer and report what they sent; the drill judges them
// by evidence elsewhere (the host's neighbour table, a witness on the
// host's bridge, the peer's witness, the DHCP server's lease file). Their
// outcome is silent once every packet left, error when one could not be
// sent or claims our own address.
//
//	arp_spoof   forged ARP on the interface holding via, claiming "claim"
//	            (an address that is not ours) at our MAC, or at "src_mac",
//	            which forges the Ethernet source too. "op" is gratuitous
//	            (a request from the claim for the claim, to broadcast),
//	            reply (to "target" at "dst_mac", required) or request (from
//	            the claim for "target", to broadcast or "dst_mac").
//	            Evidence: source (the claim), mac (the sender used),
//	            interface, sent.
//	forged_udp  the nonce line to target:port from "src_ip", a forged IPv4
//	            source, and a random ephemeral port, written whole to a
//	            raw socket (IPPROTO_RAW) so the kernel routes it and
//	            resolves the next hop; the UDP checksum is right for the
//	            forged source. A capture counts the datagrams leaving:
//	            none left (no next hop) is an error. Evidence: source (the
//	            forged address), src_port, interface, sent.
//
//	dhcp_forge  one DHCP message ("dhcp": release, decline, discover with
//	            rapid commit, or an INIT-REBOOT request) from our own MAC
//	            and, for a release or decline, our own address, naming a
//	            client that need not be us: "client_hw" (any length up to
//	            16 bytes; our MAC when empty) of hardware type "htype",
//	            with "client_id" when given; a release gives up "target"
//	            (ciaddr) to "server_id", a decline refuses "target".
//	            Written to a packet socket, IP and UDP headers ours.
//	            Evidence: source, mac (ours), interface, request (what it
//	            named), sent.
//	dhcp_flood  "count" made-up clients (hardware addresses "hw_prefix"
//	            plus a 3-byte index, or our own with client identifiers
//	            "client_id" plus the index) each send a DISCOVER with rapid
//	            commit and, with "target", an INIT-REBOOT request for an
//	            address of their own (target, target+1, ...), paced 2
//	            messages per 2 ms. Evidence: mac, interface, sent.
//
// Each but dhcp_flood sends three times, about 150 ms apart. Linux ignores an ARP that
// would change a neighbour entry within its locktime (1 s) of the last
// change, except a gratuitous ARP or a request for one of its own
// addresses, so a forged reply takes only on an entry older than that
// (TestPrivilegedARPSpoofLocktime measures it). A witness's frame summary
// names an ARP frame's operation (arp_op) and sender hardware address
// (arp_sender_mac): a frame claiming an address its sender does not hold,
// or whose ARP sender is not its Ethernet source, is a forgery (or a
// proxy).
//
// # Wire protocol
//
// A prober sends ProbePrefix+nonce+"\n". A TCP greeter answers one line,
// GreetPrefix+name+" "+line; a UDP echo answers EchoPrefix+name+" "+
// datagram. Canaries elsewhere (the hermetic world's internet host) speak
// the same so a positive control proves which host answered.
//
// # Plans and reports
//
// RunAgent reads a Plan (DecodePlan: strict JSON, version 1, bounded sizes,
// deadlines 100 ms..120 s) and writes a Report (version 1). Durations in
// plans are whole milliseconds (deadline_ms, delay_ms, window_ms);
// observations carry started_at (RFC 3339, nanoseconds) and elapsed_ms
// (whole milliseconds). Interfaces are always found by subnet
// (InterfaceForSubnet), never by name, with one exception: an outbound
// witness (host mode) names the host's outward interfaces ("ifaces") and
// records every IPv4 packet leaving them toward "dst_prefixes", with ports,
// TCP flags and sequence numbers and the nonce each carried.
//
// # Tests
//
// Unit tests need nothing: go test ./probes/
//
// The privileged tier builds throwaway network namespaces (names start
// with "boxpt-") joined by veth pairs, installs nft rules with
// github.com/google/nftables in a router namespace, and probes across it.
// It needs root (CAP_NET_ADMIN and CAP_NET_RAW) and skips otherwise:
//
//	sudo go test ./probes/ -run Privileged
//	sudo go test ./probes/ -run '^$' -bench BlockedPlan
//
// Fuzz the plan decoder with (a bounded minimize time keeps the fuzzer
// from stalling on large inputs):
//
//	go test ./probes/ -run '^$' -fuzz FuzzDecodePlan -fuzzminimizetime 2s
package probes
