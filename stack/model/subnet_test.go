package model_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/model"
)

func use(p, what string) model.AddressUse {
	return model.AddressUse{Prefix: netip.MustParsePrefix(p), What: what}
}

func TestPickSubnet(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pin     string
		uses    []model.AddressUse
		want    string
		auto    bool
		wantErr string
	}{
		{name: "free default", want: "10.88.0.0/24"},
		{name: "default route uses nothing", uses: []model.AddressUse{use("0.0.0.0/0", "default route")}, want: "10.88.0.0/24"},
		{name: "connected route on the default", uses: []model.AddressUse{use("10.88.0.0/24", "route dev eth1")}, want: "10.89.0.0/24", auto: true},
		{name: "a wider route covering it", uses: []model.AddressUse{use("10.88.0.0/15", "route dev vpn0")}, want: "10.90.0.0/24", auto: true},
		{name: "the host's own gateway inside it (running in a box)", uses: []model.AddressUse{use("10.88.0.1/32", "default gateway")}, want: "10.89.0.0/24", auto: true},
		{name: "a local address inside it", uses: []model.AddressUse{use("10.88.0.0/24", "address 10.88.0.7/24 on eth0"), use("10.89.0.0/24", "x")}, want: "10.90.0.0/24", auto: true},
		{name: "pinned and free", pin: "10.100.0.0/24", uses: []model.AddressUse{use("10.88.0.0/24", "x")}, want: "10.100.0.0/24"},
		{name: "pinned and claimed is refused", pin: "10.88.0.0/24", uses: []model.AddressUse{use("10.88.0.0/16", "route 10.88.0.0/16 dev eth1")}, wantErr: "BOX_SUBNET=10.88.0.0/24 is already claimed by route 10.88.0.0/16 dev eth1"},
		{name: "everything claimed", uses: []model.AddressUse{use("10.64.0.0/10", "route big")}, wantErr: "no free /24"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pin netip.Prefix
			if tc.pin != "" {
				pin = netip.MustParsePrefix(tc.pin)
			}
			got, err := model.PickSubnet(pin, tc.uses)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.Subnet.String())
			assert.Equal(t, tc.auto, got.Auto)
			if tc.auto {
				assert.Contains(t, got.Reason, "is claimed by", "an auto pick says why")
			}
		})
	}
}
