package model

import (
	"github.com/box-isolation/box/stack/incus"
)

func ProjectOf(p string) string {
	if p == "" {
		return "default"
	}
	return p
}

// IsBox reports whether an instance carries either ownership tag, and which.
func IsBox(i *incus.Instance) (string, bool) {
	switch {
	case i.Config[Current.Tag] == "1":
		return Current.Name, true
	case i.Config[Legacy.Tag] == "1":
		return Legacy.Name, true
	}
	return "", false
}
