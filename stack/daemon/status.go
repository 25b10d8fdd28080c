package daemon

import (
	"slices"
	"sync"
	"time"

	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/model"
)

// The daemon's services, as box doctor names them.
const (
	servicePorts  = "ports"
	serviceHealer = "healer"
	serviceRoutes = "routes"
	serviceEgress = "egress"
)

// serviceDoes says what each service is for.
var serviceDoes = map[string]string{
	servicePorts:  "keeps the bridge's ports isolated, in the bridge drop's port set and pinned",
	serviceHealer: "puts box's nft tables and Incus's back after another tool flushes them",
	serviceRoutes: "keeps " + string(model.LayerRoute) + "'s uplinks and routed prefixes current",
	serviceEgress: "answers allowlisted boxes' DNS and proxies their TLS and HTTP",
}

// status keeps the services' states and writes them for box doctor
// (hostns.DaemonStatusPath) whenever one changes.
type status struct {
	mu   sync.Mutex
	ino  uint64
	st   hostns.DaemonStatus
	logf func(string, ...any)
}

func newStatus(ino uint64, pid int, services []string, logf func(string, ...any)) *status {
	s := &status{ino: ino, st: hostns.DaemonStatus{PID: pid}, logf: logf}
	now := time.Now().UTC()
	for _, name := range services {
		s.st.Services = append(s.st.Services, hostns.ServiceState{Name: name, Does: serviceDoes[name], Problem: "starting", Since: now})
	}
	s.write()
	return s
}

// set records that service name is up, or down for why; a state that did
// not change writes nothing.
func (s *status) set(name string, up bool, why string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.IndexFunc(s.st.Services, func(v hostns.ServiceState) bool { return v.Name == name })
	if i < 0 {
		return
	}
	if up {
		why = ""
	}
	v := &s.st.Services[i]
	if v.Up == up && v.Problem == why {
		return
	}
	v.Up, v.Problem, v.Since = up, why, time.Now().UTC()
	s.write()
}

// write replaces the status file; s.mu is held, or s is not shared yet.
func (s *status) write() {
	if err := hostns.WriteDaemonStatus(s.ino, s.st); err != nil {
		s.logf("%v", err)
	}
}
