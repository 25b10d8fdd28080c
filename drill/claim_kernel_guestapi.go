package drill

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/model"
)

// C-KERNEL's guest API check: box's profile turns the guest API
// (/dev/incus) off, so a box must have none; one that answers fails, and
// its answers say what it would have told the box.

// The guest API's socket in a box, the paths asked of it, and its probes'
// deadline: they run one box at a time after the other probes
// (splitGuestAPI), each within guestAPIDeadlineMS, its plan's deadline
// guestAPIPlanMarginMS more.
var (
	guestAPISocket       = "/dev/incus/sock"
	guestAPIPaths        = []string{"/1.0", "/1.0/config", "/1.0/meta-data", "/1.0/devices"}
	guestAPIDeadlineMS   = 1000
	guestAPIPlanMarginMS = 500
)

// readGuestAPIConfig reads whether each probe box's config turns its
// guest API off: a box with no /dev/incus passes the guest API check only
// when its config says so (a socket merely missing, with the API on,
// proves nothing about what it would answer).
func readGuestAPIConfig(ctx context.Context, r *run) error {
	g := keep(r.state, KernelID, &guestAPIConfig{off: map[Place]bool{}})
	for place, name := range r.names {
		inst, _, err := r.boxClient(place).Instances().Get(ctx, name)
		if err != nil {
			continue // judged inconclusive: no config read
		}
		g.off[place] = model.GuestAPIOff(inst.ExpandedConfig)
	}
	return nil
}

// guestAPIConfig is what C-KERNEL read of the probe boxes' config before
// the probes: whether each turns its guest API off (a box missing was not
// read).
type guestAPIConfig struct{ off map[Place]bool }

// guestAPIOff says whether a probe box's config turns its guest API off,
// and whether it was read.
func (kj *kernelJudge) guestAPIOff(place Place) (off, read bool) {
	if g := stateOf[guestAPIConfig](kj.r.state, KernelID); g != nil {
		off, read = g.off[place]
	}
	return off, read
}

// judgeGuestAPI: the guest API tells a box its own user.* and cloud-init.*
// keys (among them the run's tag, the control that the answer is this
// box's), its own name, its own NIC's MAC, and nothing of any other.
func (kj *kernelJudge) judgeGuestAPI(res Result, answers []probes.HTTPAnswer) Result {
	told := kj.guestAPITold(res.From, answers)
	return verdict(res, Fail, "the box has a guest API (/dev/incus answered), which box's profile turns off ("+model.GuestAPIKey+"=false): "+
		"one box's overlapping requests crash Incus 6.0's incusd (lxc/incus#3618); "+told)
}

// guestAPITold says what a guest API's answers told the box beyond its
// own (its name, its MAC, user.* and cloud-init.* keys), and where it runs.
func (kj *kernelJudge) guestAPITold(place Place, answers []probes.HTTPAnswer) string {
	name := kj.r.names[place]
	var mac net.HardwareAddr
	if e := kj.r.ends[place]; e != nil {
		mac = e.MAC
	}
	get := func(p string) (probes.HTTPAnswer, bool) {
		i := slices.IndexFunc(answers, func(a probes.HTTPAnswer) bool { return a.Path == p })
		if i < 0 || answers[i].Status != 200 {
			return probes.HTTPAnswer{}, false
		}
		return answers[i], true
	}
	cfg, ok := get("/1.0/config")
	if !ok {
		return "it gave no config list"
	}
	var keys []string
	if err := json.Unmarshal([]byte(cfg.Body), &keys); err != nil {
		return "its config list is not JSON: " + err.Error()
	}
	var bad []string
	own := false
	for _, k := range keys {
		k = strings.TrimPrefix(k, "/1.0/config/")
		if k == TagRun {
			own = true
		}
		if !strings.HasPrefix(k, "user.") && !strings.HasPrefix(k, "cloud-init.") {
			bad = append(bad, "config key "+k)
		}
	}
	if md, ok := get("/1.0/meta-data"); ok {
		for _, line := range strings.Split(md.Body, "\n") {
			if h, ok := strings.CutPrefix(line, "local-hostname: "); ok && strings.TrimSpace(h) != name {
				bad = append(bad, "meta-data names "+strings.TrimSpace(h)+", not "+name)
			}
		}
	}
	if dv, ok := get("/1.0/devices"); ok {
		var devs map[string]map[string]string
		if json.Unmarshal([]byte(dv.Body), &devs) == nil {
			for dn, d := range devs {
				if d["type"] == "nic" && mac != nil && d["hwaddr"] != "" && !strings.EqualFold(d["hwaddr"], mac.String()) {
					bad = append(bad, fmt.Sprintf("device %s has MAC %s, not the box's %s", dn, d["hwaddr"], mac))
				}
			}
		}
	}
	if len(bad) > 0 {
		return "it tells the box what is not its own: " + strings.Join(bad, "; ")
	}
	if !own {
		return fmt.Sprintf("its config list (%d keys) lacks the run's tag %s: not this box's answer", len(keys), TagRun)
	}
	where := ""
	if api, ok := get("/1.0"); ok {
		var m map[string]any
		if json.Unmarshal([]byte(api.Body), &m) == nil {
			where = fmt.Sprintf("; it says the box runs on %v", m["location"])
		}
	}
	return fmt.Sprintf("it told %d config keys, all user.* or cloud-init.* and the run's tag among them; its own name and MAC%s", len(keys), where)
}

// splitGuestAPI takes the guest API probes (unix_http on the guest
// API's socket) out of each plan into a plan of their own for the same
// place; plans are left as they are. The run sends them one box at a
// time, after the rest (C-KERNEL's apart): incusd 6.0 crashes on a guest
// API request while another box's connection opens or closes
// (lxc/incus#3618), and boxes' plans start some tens of milliseconds
// apart, so a stagger inside the plans was not enough (a clean-clone make
// test lost the world's incusd so).
func splitGuestAPI(plans map[Place]*probes.Plan) (rest, guestAPI map[Place]*probes.Plan) {
	rest, guestAPI = map[Place]*probes.Plan{}, map[Place]*probes.Plan{}
	for place, p := range plans {
		isGuestAPI := func(s probes.ProbeSpec) bool { return s.Kind == probes.KindUnixHTTP && s.Socket == guestAPISocket }
		if !slices.ContainsFunc(p.Probes, isGuestAPI) {
			rest[place] = p
			continue
		}
		q := *p
		q.Probes = slices.DeleteFunc(slices.Clone(p.Probes), isGuestAPI)
		g := &probes.Plan{Version: p.Version, DeadlineMS: guestAPIDeadlineMS + guestAPIPlanMarginMS}
		for _, s := range p.Probes {
			if isGuestAPI(s) {
				g.Probes = append(g.Probes, s)
			}
		}
		if len(q.Probes) > 0 || len(q.Listeners)+len(q.Witnesses)+len(q.Neighbors) > 0 || q.Nest != nil {
			rest[place] = &q
		}
		guestAPI[place] = g
	}
	return rest, guestAPI
}
