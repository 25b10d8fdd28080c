package boxes

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
)

// TestNewBoxType: the server's drivers decide unless the operator chose,
// and a choice is made without asking the server.
func TestNewBoxType(t *testing.T) {
	for _, tc := range []struct {
		name, driver, want string
		wantType           string
		chosen             bool
		reason             string
	}{
		{name: "a host that can run VMs", driver: "lxc | qemu", wantType: model.TypeVM, reason: "this host can run VMs"},
		{name: "qemu alone", driver: "qemu", wantType: model.TypeVM, reason: "this host can run VMs"},
		{name: "a host that cannot", driver: "lxc", wantType: model.TypeContainer, reason: "this host cannot run VMs (incus drivers: lxc)"},
		{name: "no driver reported", driver: "", wantType: model.TypeContainer, reason: "this host cannot run VMs (incus drivers: )"},
		{name: "--container on a VM host", driver: "lxc | qemu", want: model.TypeContainer, wantType: model.TypeContainer, chosen: true, reason: "chosen by the operator"},
		{name: "--vm on a container host", driver: "lxc", want: model.TypeVM, wantType: model.TypeVM, chosen: true, reason: "chosen by the operator"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := incustest.New(t)
			srv.Drivers(tc.driver)
			h := &stack.Host{Incus: incus.New(srv.Socket())}
			d, err := (&Manager{host: h}).NewBoxType(context.Background(), tc.want)
			require.NoError(t, err)
			assert.Equal(t, model.TypeDecision{Type: tc.wantType, Reason: tc.reason, Chosen: tc.chosen}, d)
			asked := len(srv.Find("GET", "/1.0")) > 0
			assert.Equal(t, !tc.chosen, asked, "the server is asked only when the operator did not choose")
		})
	}
}

func TestDecideTypeRefuses(t *testing.T) {
	_, err := model.DecideType(&incus.Server{}, "vm")
	require.ErrorContains(t, err, `instance type "vm"`)
	_, err = model.DecideType(nil, "")
	require.ErrorContains(t, err, "no server information")
}

func TestMintRefusesAnUnknownType(t *testing.T) {
	srv := incustest.New(t)
	h := &stack.Host{Incus: incus.New(srv.Socket())}
	_, err := (&Manager{host: h}).Mint(context.Background(), MintRequest{Name: "b", Image: "img", Type: "vm"})
	require.ErrorContains(t, err, `minting b: instance type "vm"`)
	assert.Empty(t, srv.Requests(), "refused before incusd is asked")
}
