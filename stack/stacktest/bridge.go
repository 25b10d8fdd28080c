package stacktest

import (
	"encoding/json"
	"maps"
	"net/http"
	"strings"
	"sync"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
)

// Bridge is the stack's bridge on a fake incusd (GET and PUT of
// /1.0/networks/boxnet): its config is what base says at each GET, with
// the user keys the last PUT wrote (box's own keys, as Incus keeps them).
type Bridge struct {
	base func() map[string]string
	mu   sync.Mutex
	user map[string]string
}

// ServeBridge serves the bridge on s, its config base's.
func ServeBridge(s *incustest.Server, base func() map[string]string) *Bridge {
	b := &Bridge{base: base, user: map[string]string{}}
	s.Handle("GET /1.0/networks/boxnet", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, map[string]any{"name": "boxnet", "config": b.Config()})
	})
	s.Handle("PUT /1.0/networks/boxnet", func(w http.ResponseWriter, r *http.Request) {
		var put incus.NetworkPut
		if err := json.NewDecoder(r.Body).Decode(&put); err != nil {
			incustest.Error(w, http.StatusBadRequest, err.Error())
			return
		}
		user := map[string]string{}
		for k, v := range put.Config {
			if strings.HasPrefix(k, "user.") {
				user[k] = v
			}
		}
		b.mu.Lock()
		b.user = user
		b.mu.Unlock()
		incustest.Sync(w, nil)
	})
	return b
}

// ServeStaticBridge serves a bridge whose config is config, with the user
// keys a PUT writes.
func ServeStaticBridge(s *incustest.Server, config map[string]string) *Bridge {
	return ServeBridge(s, func() map[string]string { return maps.Clone(config) })
}

// Config is the bridge's config now.
func (b *Bridge) Config() map[string]string {
	cfg := b.base()
	b.mu.Lock()
	defer b.mu.Unlock()
	maps.Copy(cfg, b.user)
	return cfg
}
