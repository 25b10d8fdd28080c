package probes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const validPlan = `{
  "version": 1,
  "deadline_ms": 3000,
  "link_local": {"via": "10.88.0.0/24"},
  "neighbors": [{"via": "10.88.0.0/24", "address": "10.88.0.6", "mac": "02:00:00:00:00:06"}],
  "listeners": [
    {"id": "greet", "kind": "tcp_greeter", "name": "peer-a", "port": 7000},
    {"id": "echo", "kind": "udp_echo", "name": "peer-a", "port": 7001, "via": "10.88.0.0/24", "window_ms": 2000}
  ],
  "witnesses": [
    {"id": "w1", "via": "10.88.0.0/24", "window_ms": 2500, "nonces": ["abcdef0123456789"],
     "src_ips": ["10.88.0.5", "fe80::1"], "src_macs": ["02:00:00:00:00:01"], "proto": "udp", "port": 7001,
     "control": "0123456789abcdef"},
    {"id": "w6", "via": "10.88.0.0/24", "window_ms": 2500, "proto": "ipv6-config", "control": "0123456789abcdef"},
    {"id": "out", "ifaces": ["eth0", "wg0"], "dst_prefixes": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"], "window_ms": 2500,
     "nonces": ["abcdef0123456789"], "proto": "udp", "control": "0123456789abcdef"},
    {"id": "out-all", "ifaces": ["eth0"], "dst_prefixes": ["10.0.0.0/8"], "window_ms": 2500}
  ],
  "probes": [
    {"id": "tcp1", "kind": "tcp", "target": "10.88.0.6", "port": 7000, "deadline_ms": 1000},
    {"id": "udp1", "kind": "udp", "target": "10.88.0.6", "port": 7001, "nonce": "abcdef0123456789", "deadline_ms": 1000, "delay_ms": 200},
    {"id": "udp2", "kind": "udp", "target": "10.88.0.1", "port": 53, "payload": "nonce", "deadline_ms": 1000},
    {"id": "icmp1", "kind": "icmp", "target": "ff02::1", "via": "10.88.0.0/24", "deadline_ms": 1000},
    {"id": "arp1", "kind": "arp", "target": "10.88.0.6", "via": "10.88.0.0/24", "deadline_ms": 1000},
    {"id": "bc", "kind": "broadcast", "port": 7001, "via": "10.88.0.0/24", "deadline_ms": 1000},
    {"id": "dns1", "kind": "dns", "target": "10.88.0.1", "name": "canary.box.test", "deadline_ms": 1000},
    {"id": "dns2", "kind": "dns", "target": "10.88.0.1", "name": "10.88.0.6", "qtype": "PTR", "deadline_ms": 1000},
    {"id": "v6", "kind": "ipv6_state", "deadline_ms": 100},
    {"id": "rs", "kind": "ndp_rs", "via": "10.88.0.0/24", "deadline_ms": 1000},
    {"id": "lease", "kind": "dhcp_lease", "via": "10.88.0.0/24", "deadline_ms": 100},
    {"id": "ctl", "kind": "control", "via": "10.88.0.0/24", "nonce": "0123456789abcdef", "dst_mac": "02:00:00:00:00:06", "deadline_ms": 1000},
    {"id": "garp", "kind": "arp_spoof", "via": "10.88.0.0/24", "arp_sender_ip": "10.88.0.12", "op": "gratuitous", "deadline_ms": 1000},
    {"id": "arpreply", "kind": "arp_spoof", "via": "10.88.0.0/24", "arp_sender_ip": "10.88.0.12", "op": "reply", "target": "10.88.0.1",
     "dst_mac": "02:00:00:00:00:01", "src_mac": "02:00:00:00:00:66", "deadline_ms": 1000},
    {"id": "arpreq", "kind": "arp_spoof", "via": "10.88.0.0/24", "arp_sender_ip": "10.88.0.12", "op": "request", "target": "10.88.0.1", "deadline_ms": 1000},
    {"id": "forged", "kind": "forged_udp", "target": "10.88.0.1", "port": 7001, "src_ip": "10.88.0.12", "via": "10.88.0.0/24",
     "nonce": "forged0123456789", "deadline_ms": 1000}
  ]
}`

func TestDecodePlanValid(t *testing.T) {
	p, err := DecodePlan(strings.NewReader(validPlan))
	require.NoError(t, err)
	require.Len(t, p.Probes, 16)
	require.Len(t, p.Witnesses, 4)
	require.Len(t, p.Neighbors, 1)
	require.Len(t, p.Listeners, 2)
	require.Equal(t, "10.88.0.6", p.Probes[0].Target.String())
	require.Equal(t, "10.88.0.0/24", p.LinkLocal.Via.String())

	// What the decoder accepts, the encoder writes back to something the
	// decoder accepts again, unchanged.
	b, err := json.Marshal(p)
	require.NoError(t, err)
	p2, err := DecodePlan(bytes.NewReader(b))
	require.NoError(t, err)
	require.Equal(t, p, p2)
}

func TestDecodePlanErrors(t *testing.T) {
	probe := func(fields string) string {
		return `{"version":1,"deadline_ms":2000,"probes":[{"id":"p","deadline_ms":1000,` + fields + `}]}`
	}
	many := func(kind string, n int) string {
		var items []string
		for i := range n {
			switch kind {
			case "probes":
				items = append(items, fmt.Sprintf(`{"id":"p%d","kind":"ipv6_state","deadline_ms":100}`, i))
			case "witnesses":
				items = append(items, fmt.Sprintf(`{"id":"w%d","via":"10.0.0.0/8","window_ms":100,"src_ips":["10.0.0.1"]}`, i))
			case "listeners":
				items = append(items, fmt.Sprintf(`{"id":"l%d","kind":"udp_echo","port":%d}`, i, 1000+i))
			}
		}
		return `{"version":1,"deadline_ms":2000,"` + kind + `":[` + strings.Join(items, ",") + `]}`
	}
	tests := []struct {
		name, plan, want string
	}{
		{"empty input", ``, "empty input"},
		{"control without a nonce", probe(`"kind":"control","via":"10.0.0.0/8"`), "control needs a nonce"},
		{"control without via", probe(`"kind":"control","nonce":"0123456789abcdef"`), "control needs via"},
		{"control with a target", probe(`"kind":"control","via":"10.0.0.0/8","nonce":"0123456789abcdef","target":"10.0.0.1"`), "takes no target"},
		{"control with a bad mac", probe(`"kind":"control","via":"10.0.0.0/8","nonce":"0123456789abcdef","dst_mac":"nope"`), "dst_mac"},
		{"dst_mac on another kind", probe(`"kind":"icmp","target":"10.0.0.1","dst_mac":"02:00:00:00:00:01"`), "dst_mac is for control, arp_spoof and dhcp_forge probes"},
		{"arp_sender_ip on tcp", probe(`"kind":"tcp","target":"10.0.0.1","port":1,"arp_sender_ip":"10.0.0.2"`), "arp_sender_ip, op and src_mac are for arp_spoof probes, not tcp"},
		{"op on arp", probe(`"kind":"arp","target":"10.0.0.1","via":"10.0.0.0/8","op":"reply"`), "are for arp_spoof probes, not arp"},
		{"src_mac on control", probe(`"kind":"control","via":"10.0.0.0/8","nonce":"0123456789abcdef","src_mac":"02:00:00:00:00:01"`), "are for arp_spoof probes, not control"},
		{"src_ip on udp", probe(`"kind":"udp","target":"10.0.0.1","port":1,"src_ip":"10.0.0.2"`), "src_ip is for forged_udp probes, not udp"},
		{"src_ip on arp_spoof", probe(`"kind":"arp_spoof","via":"10.0.0.0/8","arp_sender_ip":"10.0.0.2","op":"gratuitous","src_ip":"10.0.0.3"`), "src_ip is for forged_udp probes"},
		{"arp_sender_ip on forged_udp", probe(`"kind":"forged_udp","target":"10.0.0.1","port":1,"src_ip":"10.0.0.2","arp_sender_ip":"10.0.0.2"`), "are for arp_spoof probes, not forged_udp"},
		{"arp_spoof no via", probe(`"kind":"arp_spoof","arp_sender_ip":"10.0.0.2","op":"gratuitous"`), "arp_spoof needs via"},
		{"arp_spoof ipv6 via", probe(`"kind":"arp_spoof","via":"2001:db8::/64","arp_sender_ip":"10.0.0.2","op":"gratuitous"`), "arp_spoof needs via, an IPv4 subnet"},
		{"arp_spoof no arp_sender_ip", probe(`"kind":"arp_spoof","via":"10.0.0.0/8","op":"gratuitous"`), "arp_spoof needs arp_sender_ip"},
		{"arp_spoof ipv6 arp_sender_ip", probe(`"kind":"arp_spoof","via":"10.0.0.0/8","arp_sender_ip":"2001:db8::1","op":"gratuitous"`), "arp_sender_ip 2001:db8::1 is not an IPv4 unicast address"},
		{"arp_spoof mapped claim", probe(`"kind":"arp_spoof","via":"10.0.0.0/8","arp_sender_ip":"::ffff:10.0.0.2","op":"gratuitous"`), "is not an IPv4 unicast address"},
		{"arp_spoof broadcast claim", probe(`"kind":"arp_spoof","via":"10.0.0.0/8","arp_sender_ip":"255.255.255.255","op":"gratuitous"`), "not an IPv4 unicast address"},
		{"arp_spoof zero claim", probe(`"kind":"arp_spoof","via":"10.0.0.0/8","arp_sender_ip":"0.0.0.0","op":"gratuitous"`), "not an IPv4 unicast address"},
		{"arp_spoof no op", probe(`"kind":"arp_spoof","via":"10.0.0.0/8","arp_sender_ip":"10.0.0.2"`), "arp_spoof needs op"},
		{"arp_spoof bad op", probe(`"kind":"arp_spoof","via":"10.0.0.0/8","arp_sender_ip":"10.0.0.2","op":"announce"`), "op \"announce\" is not one of gratuitous, reply, request"},
		{"arp_spoof gratuitous elsewhere", probe(`"kind":"arp_spoof","via":"10.0.0.0/8","arp_sender_ip":"10.0.0.2","op":"gratuitous","target":"10.0.0.1"`), "give no target, or arp_sender_ip"},
		{"arp_spoof reply no target", probe(`"kind":"arp_spoof","via":"10.0.0.0/8","arp_sender_ip":"10.0.0.2","op":"reply","dst_mac":"02:00:00:00:00:01"`), "arp_spoof reply needs an IPv4 target"},
		{"arp_spoof request ipv6 target", probe(`"kind":"arp_spoof","via":"10.0.0.0/8","arp_sender_ip":"10.0.0.2","op":"request","target":"2001:db8::1"`), "arp_spoof request needs an IPv4 target"},
		{"arp_spoof reply no dst_mac", probe(`"kind":"arp_spoof","via":"10.0.0.0/8","arp_sender_ip":"10.0.0.2","op":"reply","target":"10.0.0.1"`), "reply needs dst_mac"},
		{"arp_spoof bad dst_mac", probe(`"kind":"arp_spoof","via":"10.0.0.0/8","arp_sender_ip":"10.0.0.2","op":"gratuitous","dst_mac":"zz"`), "dst_mac"},
		{"arp_spoof long dst_mac", probe(`"kind":"arp_spoof","via":"10.0.0.0/8","arp_sender_ip":"10.0.0.2","op":"gratuitous","dst_mac":"02:00:00:00:00:00:00:01"`), "not an Ethernet (6-byte) address"},
		{"arp_spoof bad src_mac", probe(`"kind":"arp_spoof","via":"10.0.0.0/8","arp_sender_ip":"10.0.0.2","op":"gratuitous","src_mac":"nope"`), "src_mac"},
		{"arp_spoof group src_mac", probe(`"kind":"arp_spoof","via":"10.0.0.0/8","arp_sender_ip":"10.0.0.2","op":"gratuitous","src_mac":"ff:ff:ff:ff:ff:ff"`), "not a unicast Ethernet address"},
		{"arp_spoof zero src_mac", probe(`"kind":"arp_spoof","via":"10.0.0.0/8","arp_sender_ip":"10.0.0.2","op":"gratuitous","src_mac":"00:00:00:00:00:00"`), "not a unicast Ethernet address"},
		{"arp_spoof port", probe(`"kind":"arp_spoof","via":"10.0.0.0/8","arp_sender_ip":"10.0.0.2","op":"gratuitous","port":1`), "takes no port"},
		{"arp_spoof nonce", probe(`"kind":"arp_spoof","via":"10.0.0.0/8","arp_sender_ip":"10.0.0.2","op":"gratuitous","nonce":"abcdefgh"`), "carries no nonce"},
		{"forged_udp no src_ip", probe(`"kind":"forged_udp","target":"10.0.0.1","port":1`), "forged_udp needs src_ip"},
		{"forged_udp ipv6 src_ip", probe(`"kind":"forged_udp","target":"10.0.0.1","port":1,"src_ip":"2001:db8::1"`), "src_ip 2001:db8::1 is not an IPv4 unicast address"},
		{"forged_udp multicast src_ip", probe(`"kind":"forged_udp","target":"10.0.0.1","port":1,"src_ip":"224.0.0.1"`), "not an IPv4 unicast address"},
		{"forged_udp no target", probe(`"kind":"forged_udp","port":1,"src_ip":"10.0.0.2"`), "forged_udp needs an IPv4 unicast target"},
		{"forged_udp ipv6 target", probe(`"kind":"forged_udp","target":"2001:db8::1","port":1,"src_ip":"10.0.0.2"`), "forged_udp needs an IPv4 unicast target"},
		{"forged_udp no port", probe(`"kind":"forged_udp","target":"10.0.0.1","src_ip":"10.0.0.2"`), "forged_udp needs a port"},
		{"forged_udp ipv6 via", probe(`"kind":"forged_udp","target":"10.0.0.1","port":1,"src_ip":"10.0.0.2","via":"2001:db8::/64"`), "via must be an IPv4 subnet"},
		{"forged_udp payload", probe(`"kind":"forged_udp","target":"10.0.0.1","port":53,"src_ip":"10.0.0.2","payload":"dns"`), "payload is for udp and broadcast probes"},
		{"forged_udp dst_mac", probe(`"kind":"forged_udp","target":"10.0.0.1","port":1,"src_ip":"10.0.0.2","dst_mac":"02:00:00:00:00:01"`), "dst_mac is for control, arp_spoof and dhcp_forge"},
		{"witness control not a nonce", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","via":"10.0.0.0/8","window_ms":100,"src_ips":["10.0.0.1"],"control":"x y"}]}`, "control"},
		{"neighbor with a bad mac", `{"version":1,"deadline_ms":2000,"neighbors":[{"via":"10.0.0.0/8","address":"10.0.0.1","mac":"zz"}]}`, "neighbor 0: mac"},
		{"neighbor without an address", `{"version":1,"deadline_ms":2000,"neighbors":[{"via":"10.0.0.0/8","mac":"02:00:00:00:00:01"}]}`, "neighbor 0: address"},
		{"blank input", " \n\t", "empty input"},
		{"truncated", `{"version":1,"deadline_ms":10`, "unexpected EOF"},
		{"not an object", `[1,2]`, "cannot unmarshal"},
		{"null", `null`, "missing \"version\""},
		{"no version", `{"deadline_ms":1000}`, "missing \"version\""},
		{"version 2", `{"version":2,"deadline_ms":1000,"future":true}`, "unsupported version 2"},
		{"unknown field", `{"version":1,"deadline_ms":1000,"probez":[]}`, "unknown field \"probez\""},
		{"unknown probe field", probe(`"kind":"tcp","target":"10.0.0.1","port":1,"colour":"red"`), "unknown field \"colour\""},
		{"trailing data", `{"version":1,"deadline_ms":1000} {"version":1}`, "trailing data"},
		{"trailing garbage", `{"version":1,"deadline_ms":1000}xyz`, "trailing data"},
		{"too big", `{"version":1,"deadline_ms":1000,"x":"` + strings.Repeat("a", MaxPlanBytes) + `"}`, "larger than"},
		{"deadline too short", `{"version":1,"deadline_ms":99}`, "deadline_ms 99 out of range"},
		{"deadline too long", `{"version":1,"deadline_ms":120001}`, "deadline_ms 120001 out of range"},
		{"deadline negative", `{"version":1,"deadline_ms":-5}`, "out of range"},
		{"deadline float", `{"version":1,"deadline_ms":1.5}`, "cannot unmarshal number 1.5"},
		{"too many probes", many("probes", MaxProbes+1), "more than the limit of 1024"},
		{"too many witnesses", many("witnesses", MaxWitnesses+1), "more than the limit of 64"},
		{"too many listeners", many("listeners", MaxListeners+1), "more than the limit of 64"},
		{"unknown kind", probe(`"kind":"smoke"`), "not a probe kind"},
		{"no id", `{"version":1,"deadline_ms":2000,"probes":[{"kind":"ipv6_state","deadline_ms":100}]}`, "id is empty"},
		{"bad id", probe(`"id":"a b","kind":"ipv6_state"`), "only letters"},
		{"long id", `{"version":1,"deadline_ms":2000,"probes":[{"id":"` + strings.Repeat("x", 65) + `","kind":"ipv6_state","deadline_ms":100}]}`, "longer than 64"},
		{"duplicate id", `{"version":1,"deadline_ms":2000,"listeners":[{"id":"x","kind":"udp_echo","port":1}],"probes":[{"id":"x","kind":"ipv6_state","deadline_ms":100}]}`, "duplicate id \"x\""},
		{"probe deadline short", `{"version":1,"deadline_ms":2000,"probes":[{"id":"p","kind":"ipv6_state","deadline_ms":10}]}`, "deadline_ms 10 out of range"},
		{"probe does not fit", `{"version":1,"deadline_ms":1000,"probes":[{"id":"p","kind":"ipv6_state","deadline_ms":900,"delay_ms":100}]}`, "does not fit"},
		{"negative delay", probe(`"kind":"ipv6_state","delay_ms":-1`), "delay_ms -1 out of range"},
		{"bad address", probe(`"kind":"tcp","target":"10.0.0.300","port":1`), "ParseAddr"},
		{"zone in target", probe(`"kind":"icmp","target":"fe80::1%eth0","via":"10.0.0.0/8"`), "no zone"},
		{"tcp no port", probe(`"kind":"tcp","target":"10.0.0.1"`), "tcp needs a port"},
		{"tcp port range", probe(`"kind":"tcp","target":"10.0.0.1","port":70000`), "port 70000 out of range"},
		{"tcp no target", probe(`"kind":"tcp","port":1`), "tcp needs a target"},
		{"udp multicast", probe(`"kind":"udp","target":"224.0.0.1","port":1`), "unicast target"},
		{"link-local without via", probe(`"kind":"tcp","target":"fe80::1","port":1`), "needs via"},
		{"multicast without via", probe(`"kind":"icmp","target":"ff02::1"`), "needs via"},
		{"arp v6", probe(`"kind":"arp","target":"fe80::1","via":"10.0.0.0/8"`), "IPv4 target"},
		{"arp no via", probe(`"kind":"arp","target":"10.0.0.1"`), "arp needs via"},
		{"arp nonce", probe(`"kind":"arp","target":"10.0.0.1","via":"10.0.0.0/8","nonce":"abcdefgh"`), "no nonce"},
		{"icmp port", probe(`"kind":"icmp","target":"10.0.0.1","port":3`), "icmp takes no port"},
		{"short nonce", probe(`"kind":"udp","target":"10.0.0.1","port":1,"nonce":"abc"`), "length must be"},
		{"bad nonce", probe(`"kind":"udp","target":"10.0.0.1","port":1,"nonce":"abc def gh"`), "only letters"},
		{"duplicate nonce", `{"version":1,"deadline_ms":2000,"probes":[{"id":"a","kind":"udp","target":"10.0.0.1","port":1,"nonce":"abcdefgh","deadline_ms":100},{"id":"b","kind":"udp","target":"10.0.0.1","port":1,"nonce":"abcdefgh","deadline_ms":100}]}`, "used by another probe"},
		{"payload on tcp", probe(`"kind":"tcp","target":"10.0.0.1","port":53,"payload":"dns"`), "payload is for udp and broadcast probes"},
		{"payload on dns", probe(`"kind":"dns","target":"10.0.0.1","name":"x","payload":"dns"`), "payload is for udp and broadcast probes"},
		{"unknown payload", probe(`"kind":"udp","target":"10.0.0.1","port":53,"payload":"http"`), "payload \"http\" is not one of"},
		{"dhcp payload to ipv6", probe(`"kind":"udp","target":"2001:db8::1","port":67,"payload":"dhcp"`), "payload dhcp needs an IPv4 target"},
		{"dns no name", probe(`"kind":"dns","target":"10.0.0.1"`), "dns needs a name"},
		{"dns bad qtype", probe(`"kind":"dns","target":"10.0.0.1","name":"x","qtype":"AXFR"`), "qtype \"AXFR\""},
		{"dns bad name", probe(`"kind":"dns","target":"10.0.0.1","name":"a..b"`), "not a domain name"},
		{"dns long name", probe(`"kind":"dns","target":"10.0.0.1","name":"` + strings.Repeat("a", 254) + `"`), "name longer than 253"},
		{"name on tcp", probe(`"kind":"tcp","target":"10.0.0.1","port":1,"name":"x"`), "for dns probes"},
		{"tcp by name with a target", probe(`"kind":"tcp","target":"10.0.0.1","port":1,"name":"x.example","resolver":"10.0.0.53"`), "no target"},
		{"tcp by name without a name", probe(`"kind":"tcp","port":1,"resolver":"10.0.0.53"`), "needs a name"},
		{"resolver on udp", probe(`"kind":"udp","target":"10.0.0.1","port":1,"resolver":"10.0.0.53"`), "resolver is for a tcp probe"},
		{"dhcp_forge without dhcp", probe(`"kind":"dhcp_forge","via":"10.0.0.0/8"`), "dhcp_forge needs dhcp"},
		{"dhcp_forge unknown dhcp", probe(`"kind":"dhcp_forge","via":"10.0.0.0/8","dhcp":"inform"`), `dhcp "inform" is not one of`},
		{"dhcp_forge no via", probe(`"kind":"dhcp_forge","dhcp":"discover"`), "needs via"},
		{"dhcp_forge release without server", probe(`"kind":"dhcp_forge","via":"10.0.0.0/8","dhcp":"release","target":"10.0.0.5"`), "needs server_id"},
		{"dhcp_forge release without target", probe(`"kind":"dhcp_forge","via":"10.0.0.0/8","dhcp":"release","server_id":"10.0.0.1"`), "needs target"},
		{"dhcp_forge discover with server", probe(`"kind":"dhcp_forge","via":"10.0.0.0/8","dhcp":"discover","server_id":"10.0.0.1"`), "names no server"},
		{"dhcp_forge long client_hw", probe(`"kind":"dhcp_forge","via":"10.0.0.0/8","dhcp":"discover","client_hw":"00:01:02:03:04:05:06:07:08:09:0a:0b:0c:0d:0e:0f:10"`), "1 to 16"},
		{"dhcp_forge bad client_id", probe(`"kind":"dhcp_forge","via":"10.0.0.0/8","dhcp":"discover","client_id":"zz"`), "client_id"},
		{"dhcp_forge htype", probe(`"kind":"dhcp_forge","via":"10.0.0.0/8","dhcp":"discover","htype":256`), "htype 256 out of range"},
		{"dhcp_forge count", probe(`"kind":"dhcp_forge","via":"10.0.0.0/8","dhcp":"discover","count":3`), "for dhcp_flood"},
		{"dhcp_flood count", probe(`"kind":"dhcp_flood","via":"10.0.0.0/8","hw_prefix":"0a:b0:c5","count":2000`), "count 2000 out of range"},
		{"dhcp_flood no prefix", probe(`"kind":"dhcp_flood","via":"10.0.0.0/8","count":2`), "needs one of hw_prefix"},
		{"dhcp_flood group prefix", probe(`"kind":"dhcp_flood","via":"10.0.0.0/8","count":2,"hw_prefix":"01:00:5e"`), "group addresses"},
		{"dhcp_flood short prefix", probe(`"kind":"dhcp_flood","via":"10.0.0.0/8","count":2,"hw_prefix":"0a:b0"`), "3 bytes"},
		{"dhcp_flood with dhcp", probe(`"kind":"dhcp_flood","via":"10.0.0.0/8","count":2,"hw_prefix":"0a:b0:c5","dhcp":"release"`), "takes no dhcp"},
		{"dhcp fields on udp", probe(`"kind":"udp","target":"10.0.0.1","port":67,"client_hw":"00:01"`), "are for dhcp_forge and dhcp_flood probes"},
		{"state with target", probe(`"kind":"dhcp_lease","target":"10.0.0.1","via":"10.0.0.0/8"`), "takes no target"},
		{"lease without via", probe(`"kind":"dhcp_lease"`), "needs via"},
		{"witness no keys", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","via":"10.0.0.0/8","window_ms":100}]}`, "nothing to match"},
		{"witness arp_sender without arp", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","via":"10.0.0.0/8","window_ms":100,"src_ips":["10.0.0.2"],"arp_sender":"02:00:00:00:00:01"}]}`, "arp_sender needs proto arp"},
		{"witness arp_sender not a MAC", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","via":"10.0.0.0/8","window_ms":100,"src_ips":["10.0.0.2"],"proto":"arp","arp_sender":"nope"}]}`, "arp_sender"},
		{"witness no via", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","window_ms":100,"src_ips":["10.0.0.1"]}]}`, "via: a subnet is required"},
		{"witness window", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","via":"10.0.0.0/8","window_ms":1990,"src_ips":["10.0.0.1"]}]}`, "window_ms 1990 out of range"},
		{"witness bad mac", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","via":"10.0.0.0/8","window_ms":100,"src_macs":["zz"]}]}`, "src_macs"},
		{"witness port no proto", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","via":"10.0.0.0/8","window_ms":100,"src_ips":["10.0.0.1"],"port":5}]}`, "port needs proto"},
		{"witness bad proto", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","via":"10.0.0.0/8","window_ms":100,"src_ips":["10.0.0.1"],"proto":"sctp"}]}`, "proto \"sctp\""},
		{"outbound with via", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","window_ms":100,"via":"10.0.0.0/8","ifaces":["eth0"],"dst_prefixes":["10.0.0.0/8"]}]}`, "mutually exclusive"},
		{"outbound without prefixes", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","window_ms":100,"ifaces":["eth0"]}]}`, "ifaces needs dst_prefixes"},
		{"prefixes without ifaces", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","window_ms":100,"via":"10.0.0.0/8","src_ips":["10.0.0.1"],"dst_prefixes":["10.0.0.0/8"]}]}`, "dst_prefixes is for an outbound witness"},
		{"outbound ipv6 prefix", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","window_ms":100,"ifaces":["eth0"],"dst_prefixes":["fc00::/7"]}]}`, "not an IPv4 prefix"},
		{"outbound host bits", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","window_ms":100,"ifaces":["eth0"],"dst_prefixes":["10.1.2.3/8"]}]}`, "host bits set (10.0.0.0/8?)"},
		{"outbound bad iface", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","window_ms":100,"ifaces":["eth0/1"],"dst_prefixes":["10.0.0.0/8"]}]}`, "not an interface name"},
		{"outbound long iface", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","window_ms":100,"ifaces":["abcdefghijklmnop"],"dst_prefixes":["10.0.0.0/8"]}]}`, "not an interface name"},
		{"outbound empty iface", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","window_ms":100,"ifaces":[""],"dst_prefixes":["10.0.0.0/8"]}]}`, "not an interface name"},
		{"outbound duplicate iface", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","window_ms":100,"ifaces":["eth0","eth0"],"dst_prefixes":["10.0.0.0/8"]}]}`, "given twice"},
		{"outbound arp", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","window_ms":100,"ifaces":["eth0"],"dst_prefixes":["10.0.0.0/8"],"proto":"arp"}]}`, "IPv4 only"},
		{"outbound ipv6 dst_ip", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","window_ms":100,"ifaces":["eth0"],"dst_prefixes":["10.0.0.0/8"],"dst_ip":"2001:db8::1"}]}`, "IPv4 only"},
		{"outbound too many ifaces", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","window_ms":100,"ifaces":["e0","e1","e2","e3","e4","e5","e6","e7","e8","e9","e10","e11","e12","e13","e14","e15","e16"],"dst_prefixes":["10.0.0.0/8"]}]}`, "more than the limit of 16"},
		{"outbound too many prefixes", `{"version":1,"deadline_ms":2000,"witnesses":[{"id":"w","window_ms":100,"ifaces":["eth0"],"dst_prefixes":["10.0.0.0/16","10.1.0.0/16","10.2.0.0/16","10.3.0.0/16","10.4.0.0/16","10.5.0.0/16","10.6.0.0/16","10.7.0.0/16","10.8.0.0/16","10.9.0.0/16","10.10.0.0/16","10.11.0.0/16","10.12.0.0/16","10.13.0.0/16","10.14.0.0/16","10.15.0.0/16","10.16.0.0/16","10.17.0.0/16","10.18.0.0/16","10.19.0.0/16","10.20.0.0/16","10.21.0.0/16","10.22.0.0/16","10.23.0.0/16","10.24.0.0/16","10.25.0.0/16","10.26.0.0/16","10.27.0.0/16","10.28.0.0/16","10.29.0.0/16","10.30.0.0/16","10.31.0.0/16","10.32.0.0/16","10.33.0.0/16","10.34.0.0/16","10.35.0.0/16","10.36.0.0/16","10.37.0.0/16","10.38.0.0/16","10.39.0.0/16","10.40.0.0/16","10.41.0.0/16","10.42.0.0/16","10.43.0.0/16","10.44.0.0/16","10.45.0.0/16","10.46.0.0/16","10.47.0.0/16","10.48.0.0/16","10.49.0.0/16","10.50.0.0/16","10.51.0.0/16","10.52.0.0/16","10.53.0.0/16","10.54.0.0/16","10.55.0.0/16","10.56.0.0/16","10.57.0.0/16","10.58.0.0/16","10.59.0.0/16","10.60.0.0/16","10.61.0.0/16","10.62.0.0/16","10.63.0.0/16","10.64.0.0/16"]}]}`, "more than the limit of 64"},
		{"listener kind", `{"version":1,"deadline_ms":2000,"listeners":[{"id":"l","kind":"http","port":80}]}`, "not a listener kind"},
		{"listener port", `{"version":1,"deadline_ms":2000,"listeners":[{"id":"l","kind":"udp_echo","port":0}]}`, "port 0 out of range"},
		{"listener name", `{"version":1,"deadline_ms":2000,"listeners":[{"id":"l","kind":"udp_echo","port":1,"name":"a b"}]}`, "printable ASCII"},
		{"link-local address", `{"version":1,"deadline_ms":2000,"link_local":{"via":"10.0.0.0/8","address":"2001:db8::1"}}`, "not an fe80::/10 address"},
		{"link-local no via", `{"version":1,"deadline_ms":2000,"link_local":{}}`, "via: a subnet is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodePlan(strings.NewReader(tt.plan))
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.want)
			require.True(t, strings.HasPrefix(err.Error(), "decode plan: "), "errors say where they come from: %v", err)
			for _, c := range err.Error() {
				require.Less(t, c, rune(0x7f), "plain ASCII errors: %q", err.Error())
			}
		})
	}
}

func TestDecodePlanLimitsAtTheEdge(t *testing.T) {
	var items []string
	for i := range MaxProbes {
		items = append(items, fmt.Sprintf(`{"id":"p%d","kind":"ipv6_state","deadline_ms":100}`, i))
	}
	_, err := DecodePlan(strings.NewReader(`{"version":1,"deadline_ms":120000,"probes":[` + strings.Join(items, ",") + `]}`))
	require.NoError(t, err, "exactly MaxProbes is allowed")
	_, err = DecodePlan(strings.NewReader(`{"version":1,"deadline_ms":100}`))
	require.NoError(t, err, "the minimum deadline is allowed")
}

func FuzzDecodePlan(f *testing.F) {
	f.Add([]byte(validPlan))
	f.Add([]byte(`{"version":1,"deadline_ms":1000}`))
	f.Add([]byte(`{"version":1,"deadline_ms":1000,"probes":[{"id":"a","kind":"dns","target":"10.0.0.1","name":"10.0.0.2","qtype":"PTR","deadline_ms":100}]}`))
	f.Add([]byte(`{"version":2}`))
	f.Add([]byte(`{"version":1,"deadline_ms":1000}{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := DecodePlan(bytes.NewReader(data))
		if err != nil {
			if p != nil {
				t.Fatalf("a plan and an error: %v", err)
			}
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		// An accepted plan survives a round trip unchanged.
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		p2, err := DecodePlan(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("re-decode of %s: %v", b, err)
		}
		b2, _ := json.Marshal(p2)
		if !bytes.Equal(b, b2) {
			t.Fatalf("round trip changed the plan:\n%s\n%s", b, b2)
		}
	})
}
