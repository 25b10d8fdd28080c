// Package jsonkeys lists the key paths a Go type takes in JSON, so a test
// can hold a versioned JSON interface (the drill's report, drill list
// --json) to a golden file: a key added, renamed or removed shows.
package jsonkeys

import (
	"encoding"
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
)

// Paths lists the JSON key paths of values of type t, sorted: "a.b" for a
// field b of an object a, "a[]" for the elements of a list, "a{}" for the
// values of a map. Types that marshal themselves (addresses, times) are
// leaves.
func Paths(t reflect.Type) []string {
	out := map[string]bool{}
	walk(t, "", out, map[reflect.Type]bool{})
	keys := make([]string, 0, len(out))
	for k := range out {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

var (
	marshaler     = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

func walk(t reflect.Type, prefix string, out map[string]bool, seen map[reflect.Type]bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Implements(marshaler) || t.Implements(textMarshaler) || reflect.PointerTo(t).Implements(marshaler) || reflect.PointerTo(t).Implements(textMarshaler) {
		return
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return // []byte is a string
		}
		walk(t.Elem(), prefix+"[]", out, seen)
	case reflect.Map:
		walk(t.Elem(), prefix+"{}", out, seen)
	case reflect.Struct:
		if seen[t] {
			out[prefix+" (recursive)"] = true
			return
		}
		seen[t] = true
		defer delete(seen, t)
		for f := range t.Fields() {
			tag := f.Tag.Get("json")
			name, _, _ := strings.Cut(tag, ",")
			if tag == "-" || (!f.IsExported() && !f.Anonymous) {
				continue
			}
			if f.Anonymous && name == "" {
				walk(f.Type, prefix, out, seen)
				continue
			}
			if name == "" {
				name = f.Name
			}
			p := name
			if prefix != "" {
				p = prefix + "." + name
			}
			out[p] = true
			walk(f.Type, p, out, seen)
		}
	}
}

// Golden reads a golden file of key paths, one a line, for a test to hold
// Paths to.
func Golden(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n"), nil
}
