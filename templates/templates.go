package templates

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"reflect"
	"regexp"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Default is the template box uses when none is named.
const Default = "blank"

//go:embed builtin
var builtinFS embed.FS

// builtinFile is the one file each builtin/<name>/ folder holds.
const builtinFile = "template.yaml"

// Template is one template: typed data from which user-data is rendered.
//
// It has no field for a network, a profile, a device or a security.* key on
// purpose: what cannot be expressed cannot take a box off the isolation stack.
// Nesting is a choice, not a key: the stack alone turns it into the instance
// keys it stands for (stack.NestingConfig), which its census knows.
type Template struct {
	// Name comes from where the template was found, not from its content,
	// so a template cannot claim another's name.
	Name        string `yaml:"-" json:"name"`
	Description string `yaml:"description" json:"description"`
	// Image is the default image alias; box overrides it with --image or
	// BOX_IMAGE on hosts that cannot reach an image server.
	Image     string    `yaml:"image" json:"image"`
	User      string    `yaml:"user" json:"user"`
	Resources Resources `yaml:"resources" json:"resources"`
	// Agent is nil for a template without a coding agent (blank).
	Agent *Agent `yaml:"agent,omitempty" json:"agent,omitempty"`
	// Nesting lets containers run inside the box (Docker): box new
	// --nesting asks for it too. What it costs: docs/box.md.
	Nesting bool `yaml:"nesting,omitempty" json:"nesting"`
}

// Agent is the coding agent a template installs, unauthenticated.
type Agent struct {
	Name        string `yaml:"name" json:"name"`                 // shown to people and written into the context file
	Package     string `yaml:"package" json:"package"`           // npm package, installed globally
	Command     string `yaml:"command" json:"command"`           // what the operator runs inside the box
	ContextFile string `yaml:"context_file" json:"context_file"` // under ~/, read by the agent at start
}

// Builtin returns the built-in templates, sorted by name.
func Builtin() ([]Template, error) {
	entries, err := fs.ReadDir(builtinFS, "builtin")
	if err != nil {
		return nil, fmt.Errorf("read built-in templates: %w", err)
	}
	var out []Template
	for _, e := range entries {
		if !e.IsDir() {
			// A stray file would otherwise be silently ignored and a
			// template misnamed by one letter would never load.
			return nil, fmt.Errorf("built-in templates: unexpected file %q (want builtin/<name>/%s)", e.Name(), builtinFile)
		}
		data, err := builtinFS.ReadFile(path.Join("builtin", e.Name(), builtinFile))
		if err != nil {
			return nil, fmt.Errorf("built-in template %q: %w", e.Name(), err)
		}
		t, err := Parse(e.Name(), data)
		if err != nil {
			return nil, fmt.Errorf("built-in %w", err)
		}
		out = append(out, *t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Names returns the names of the built-in templates, sorted.
func Names() ([]string, error) {
	all, err := Builtin()
	if err != nil {
		return nil, err
	}
	names := make([]string, len(all))
	for i, t := range all {
		names[i] = t.Name
	}
	return names, nil
}

// Get returns the built-in template called name. An unknown name is an error
// listing the available templates, so a typo tells the operator what exists.
func Get(name string) (*Template, error) {
	all, err := Builtin()
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(all))
	for i := range all {
		if all[i].Name == name {
			return &all[i], nil
		}
		names = append(names, all[i].Name)
	}
	return nil, fmt.Errorf("unknown template %q (available: %s)", name, strings.Join(names, ", "))
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

// Parse decodes and validates one template. Unknown keys, duplicate keys,
// a second document and invalid values are all errors naming the template.
func Parse(name string, data []byte) (*Template, error) {
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("template name %q: want lowercase letters, digits and '-', starting with a letter, at most 32", name)
	}
	t, err := decode(data)
	if err != nil {
		return nil, fmt.Errorf("template %q: %w", name, err)
	}
	t.Name = name
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return t, nil
}

func decode(data []byte) (*Template, error) {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty")
		}
		return nil, fmt.Errorf("parse: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("more than one YAML document")
	}
	// Walk the keys ourselves first: yaml's own message ("field x not found
	// in type templates.Template") names a Go type, not the key's path.
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if err := checkKeys(root, reflect.TypeFor[Template](), ""); err != nil {
		return nil, err
	}
	// Then decode strictly anyway, so a key the walk missed is still refused.
	var t Template
	strict := yaml.NewDecoder(bytes.NewReader(data))
	strict.KnownFields(true)
	if err := strict.Decode(&t); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	return &t, nil
}

// checkKeys refuses any mapping key that has no field in typ, recursively.
func checkKeys(n *yaml.Node, typ reflect.Type, prefix string) error {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if typ.Kind() != reflect.Struct {
		return nil
	}
	if n.Kind == yaml.AliasNode {
		// Anchors would let one key's value hide in another place; a
		// template is a short file and has no need for them.
		return fmt.Errorf("line %d: aliases are not allowed", n.Line)
	}
	if n.Kind != yaml.MappingNode {
		what := "the template"
		if prefix != "" {
			what = fmt.Sprintf("key %q", strings.TrimSuffix(prefix, "."))
		}
		return fmt.Errorf("line %d: %s must be a mapping", n.Line, what)
	}
	known := map[string]reflect.StructField{}
	var names []string
	for i := range typ.NumField() {
		f := typ.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if tag == "" || tag == "-" {
			continue
		}
		known[tag] = f
		names = append(names, tag)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		f, ok := known[k.Value]
		if !ok {
			return fmt.Errorf("line %d: unknown key %q (known keys here: %s)", k.Line, prefix+k.Value, strings.Join(names, ", "))
		}
		if err := checkKeys(v, f.Type, prefix+k.Value+"."); err != nil {
			return err
		}
	}
	return nil
}

var (
	// Debian's adduser NAME_REGEX, capped at the 32 bytes useradd allows.
	userRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)
	// A remote:alias or a fingerprint; nothing that needs quoting.
	imageRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]*$`)
	// An npm name, optionally scoped, optionally with an exact version or
	// tag. Strict because it goes into a shell command line.
	packageRE = regexp.MustCompile(`^(@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*(@[A-Za-z0-9][A-Za-z0-9.+-]*)?$`)
	// A bare command name: it is looked up in /usr/local/bin.
	commandRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
	// One path segment of a context file; no spaces or shell specials.
	segmentRE = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)
)

// reservedUsers are accounts an image already has; the agent must run as a
// fresh unprivileged user, never as one of these.
var reservedUsers = map[string]bool{
	"root": true, "daemon": true, "bin": true, "sys": true, "sync": true,
	"nobody": true, "_apt": true, "messagebus": true, "sshd": true,
	"systemd-network": true, "systemd-resolve": true, "systemd-timesync": true,
}

// Validate checks every field. Parse calls it; call it again after building
// or changing a Template by hand.
func (t *Template) Validate() error {
	if err := t.validate(); err != nil {
		return fmt.Errorf("template %q: %w", t.Name, err)
	}
	return nil
}

func (t *Template) validate() error {
	if strings.TrimSpace(t.Description) == "" {
		return errors.New("description is missing")
	}
	if strings.ContainsAny(t.Description, "\r\n") {
		return errors.New("description must be one line")
	}
	if t.Image == "" {
		return errors.New("image is missing")
	}
	if !imageRE.MatchString(t.Image) {
		return fmt.Errorf("image %q: want an image alias like images:debian/12/cloud", t.Image)
	}
	if err := validUser(t.User); err != nil {
		return err
	}
	if err := t.Resources.Validate(); err != nil {
		return fmt.Errorf("resources: %w", err)
	}
	if t.Agent != nil {
		if err := t.Agent.validate(); err != nil {
			return fmt.Errorf("agent: %w", err)
		}
	}
	return nil
}

func validUser(u string) error {
	if u == "" {
		return errors.New("user is missing")
	}
	if !userRE.MatchString(u) {
		return fmt.Errorf("user %q is not a valid Unix user name (lowercase letters, digits, '_' and '-', starting with a letter or '_', at most 32)", u)
	}
	if reservedUsers[u] || strings.HasPrefix(u, "systemd-") {
		return fmt.Errorf("user %q is a system account; the agent runs as its own unprivileged user", u)
	}
	return nil
}

func (a *Agent) validate() error {
	missing := []string{}
	for _, f := range []struct{ key, v string }{
		{"name", a.Name}, {"package", a.Package}, {"command", a.Command}, {"context_file", a.ContextFile},
	} {
		if strings.TrimSpace(f.v) == "" {
			missing = append(missing, f.key)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s (an agent needs name, package, command and context_file)", strings.Join(missing, ", "))
	}
	if strings.ContainsAny(a.Name, "\r\n`") {
		return fmt.Errorf("name %q must be one line without backquotes", a.Name)
	}
	if !packageRE.MatchString(a.Package) {
		return fmt.Errorf("package %q is not an npm package name", a.Package)
	}
	if !commandRE.MatchString(a.Command) {
		return fmt.Errorf("command %q: want a bare command name", a.Command)
	}
	if _, err := contextRel(a.ContextFile); err != nil {
		return err
	}
	return nil
}

// contextRel returns the context file's path relative to the home folder.
// It must stay under ~/ because it is written as the user, into their home.
func contextRel(p string) (string, error) {
	rel, ok := strings.CutPrefix(p, "~/")
	if !ok {
		return "", fmt.Errorf("context_file %q must be under ~/", p)
	}
	if rel == "" || path.Clean(rel) != rel {
		return "", fmt.Errorf("context_file %q: want a clean file path under ~/", p)
	}
	for _, seg := range strings.Split(rel, "/") {
		if seg == "." || seg == ".." || !segmentRE.MatchString(seg) {
			return "", fmt.Errorf("context_file %q: segment %q is not allowed", p, seg)
		}
	}
	return rel, nil
}
