package model_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

func TestDecideTypeRefuses(t *testing.T) {
	_, err := model.DecideType(&incus.Server{}, "vm")
	require.ErrorContains(t, err, `instance type "vm"`)
	_, err = model.DecideType(nil, "")
	require.ErrorContains(t, err, "no server information")
}
