package drill

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/box-isolation/box/stack/boxes"

	"github.com/box-isolation/box/stack"
)

// C-KERNEL's mutations (drill/mutate.go's table): each takes clone-a past
// the kernel boundary, as the escape hatch or plain incus would, and the
// agent in clone-a must see it. Keys Incus applies only at start (the
// privilege, raw.lxc, raw.idmap) restart clone-a, through box's own stop
// and start so its port is isolated and pinned again; devices are
// hot-plugged into the running box. The mutated box goes with the run's
// boxes at teardown: nothing to restore.
const (
	hostPathSource = "/usr/share"
	unixCharSource = "/dev/kmsg"
	rawLXCBind     = "lxc.mount.entry = " + hostPathSource + " mnt/drill-host none bind,ro,create=dir 0 0"
)

var (
	hostPathDisk   = map[string]map[string]string{"drillhost": {"type": "disk", "source": hostPathSource, "path": "/mnt/drill-disk", "readonly": "true"}}
	unixCharDevice = map[string]map[string]string{"drillkmsg": {"type": "unix-char", "source": unixCharSource, "path": unixCharSource}}
)

// kernelMutation sets config keys and adds devices on the run's clone-a,
// restarting it when a key needs a start to apply.
func kernelMutation(cfg map[string]string, devices map[string]map[string]string) func(ctx context.Context, h *stack.Host, names []string) error {
	return func(ctx context.Context, h *stack.Host, names []string) error {
		if len(names) < 3 {
			return fmt.Errorf("no clone-a among the run's boxes %v", names)
		}
		name := names[2]
		inst, etag, err := h.Incus.Instances().Get(ctx, name)
		if err != nil {
			return err
		}
		put := inst.Writable()
		maps.Copy(put.Config, cfg)
		if put.Devices == nil {
			put.Devices = map[string]map[string]string{}
		}
		maps.Copy(put.Devices, devices)
		if err := h.Incus.Instances().Update(ctx, name, put, etag); err != nil {
			return fmt.Errorf("changing %s: %w", name, err)
		}
		if len(cfg) == 0 {
			return nil
		}
		if err := boxes.NewManager(h).Stop(ctx, name, true); err != nil {
			return err
		}
		if err := boxes.NewManager(h).Start(ctx, name); err != nil {
			return err
		}
		_, err = h.Addresses().Wait(ctx, name, 30*time.Second)
		return err
	}
}
