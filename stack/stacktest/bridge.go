package stacktest

import (
	"encoding/json"
	"maps"
	"net/http"
	"sync"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
)

// Bridge is the stack's bridge on a fake incusd (GET and PUT of
// /1.0/networks/boxnet): its config starts as given, and a PUT replaces
// it, as Incus does.
type Bridge struct {
	mu     sync.Mutex
	config map[string]string
}

// ServeBridge serves the bridge with config on s.
func ServeBridge(s *incustest.Server, config map[string]string) *Bridge {
	b := &Bridge{config: maps.Clone(config)}
	s.Handle("GET /1.0/networks/boxnet", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, map[string]any{"name": "boxnet", "config": b.Config()})
	})
	s.Handle("PUT /1.0/networks/boxnet", func(w http.ResponseWriter, r *http.Request) {
		var put incus.NetworkPut
		if err := json.NewDecoder(r.Body).Decode(&put); err != nil {
			incustest.Error(w, http.StatusBadRequest, err.Error())
			return
		}
		b.mu.Lock()
		b.config = put.Config
		b.mu.Unlock()
		incustest.Sync(w, nil)
	})
	return b
}

// Config is the bridge's config now.
func (b *Bridge) Config() map[string]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.config)
}
