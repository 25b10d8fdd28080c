package stack

import (
	"net/netip"
	"testing"

	"github.com/box-isolation/box/stack/model"
	"github.com/stretchr/testify/assert"
)

func TestSameMeaningFlipsSpellingOnly(t *testing.T) {
	for v, want := range map[string]string{"": "true", "true": "", "false": "off", "off": "false", "0": "false"} {
		assert.Equal(t, want, sameMeaning(v), "ipv4.firewall=%q", v)
	}
}

func TestIncusChainFindings(t *testing.T) {
	d := model.BuildDesired(netip.MustParsePrefix("10.88.0.0/24"), model.Options{})
	whole := map[string]int{"acl.boxnet": 9, "aclin.boxnet": 7, "aclout.boxnet": 5, "aclfwd.boxnet": 2, "pstrt.boxnet": 1, "fwd.boxnet": 2}
	assert.Empty(t, IncusChainFindings(d, whole, true), "Incus's table as it writes it")

	gone := IncusChainFindings(d, nil, false)
	assert.Len(t, gone, 5, "each chain the stack needs, named")
	for _, f := range gone {
		assert.Contains(t, f.Problem, "whole table inet incus is gone")
	}

	partial := map[string]int{"acl.boxnet": 0, "aclin.boxnet": 7, "aclout.boxnet": 5, "aclfwd.boxnet": 2}
	fs := IncusChainFindings(d, partial, true)
	if assert.Len(t, fs, 2) {
		byObj := map[string]model.Finding{}
		for _, f := range fs {
			byObj[f.Object] = f
		}
		assert.Equal(t, model.LayerACL, byObj["nft chain inet incus acl.boxnet"].Layer)
		assert.Contains(t, byObj["nft chain inet incus acl.boxnet"].Problem, "holds 0 rules")
		assert.Equal(t, model.LayerNAT, byObj["nft chain inet incus pstrt.boxnet"].Layer)
		assert.Contains(t, byObj["nft chain inet incus pstrt.boxnet"].Problem, "missing from the kernel")
	}
}
