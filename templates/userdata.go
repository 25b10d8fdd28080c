package templates

import (
	_ "embed"
	"fmt"
	"path"
	"slices"
	"strings"
	"text/template"
	"unicode"

	"go.yaml.in/yaml/v3"
)

// Where the user-data reports how provisioning went. Box waits for one of
// them to appear; FailedMarker's content is the reason, for the operator.
const (
	MarkerDir    = "/var/lib/box"
	ReadyMarker  = MarkerDir + "/ready"
	FailedMarker = MarkerDir + "/failed"
)

// BinDir is where an agent's command is installed. It is on the PATH Incus
// gives a non-interactive exec, so `box exec N -- claude` works without a
// login shell.
const BinDir = "/usr/local/bin"

// AgentPackages are what an agent template installs from the distribution
// before the agent itself: npm needs nodejs, agents need git and TLS roots.
var AgentPackages = []string{"nodejs", "npm", "git", "ca-certificates", "curl"}

// basePackages every template installs: without sudo, the user's sudoers
// entry is a dead file.
var basePackages = []string{"sudo", "ca-certificates"}

// RenderOptions carry what is known about the box being minted; they only
// end up in comments, for whoever reads the files later.
type RenderOptions struct {
	BoxName    string
	BoxVersion string
	// Image renders for the template's image (built once, copied into
	// every box of the template) instead of one box.
	Image bool
}

func (o RenderOptions) validate() error {
	for _, f := range []struct{ what, v string }{{"box name", o.BoxName}, {"box version", o.BoxVersion}} {
		if strings.IndexFunc(f.v, unicode.IsControl) >= 0 {
			return fmt.Errorf("%s %q contains a control character", f.what, f.v)
		}
	}
	return nil
}

// Home is the user's home folder. The user-data sets it explicitly, so the
// context file's path does not depend on the image's useradd defaults.
func (t *Template) Home() string { return "/home/" + t.User }

// ContextPath is the absolute path of the agent's context file in the box,
// or "" for a template without an agent.
func (t *Template) ContextPath() string {
	if t.Agent == nil {
		return ""
	}
	rel, err := contextRel(t.Agent.ContextFile)
	if err != nil {
		return ""
	}
	return path.Join(t.Home(), rel)
}

//go:embed context.md
var contextText string

var contextTmpl = template.Must(template.New("context.md").Option("missingkey=error").Parse(contextText))

// ContextFile renders the agent's context file: the one Markdown body every
// agent gets, with its name filled in. A template without an agent has none.
func (t *Template) ContextFile(opts RenderOptions) (string, error) {
	if t.Agent == nil {
		return "", fmt.Errorf("template %q has no agent, so no context file", t.Name)
	}
	if err := opts.validate(); err != nil {
		return "", fmt.Errorf("render context file: %w", err)
	}
	box, version := "(unnamed)", "(unknown version)"
	if opts.BoxName != "" {
		box = fmt.Sprintf("%q", opts.BoxName)
	}
	if opts.BoxVersion != "" {
		version = opts.BoxVersion
	}
	var b strings.Builder
	err := contextTmpl.Execute(&b, map[string]any{
		"Agent":    t.Agent.Name,
		"User":     t.User,
		"Template": t.Name,
		"Box":      box,
		"Version":  version,
		"Image":    opts.Image,
	})
	if err != nil {
		return "", fmt.Errorf("render context file: %w", err)
	}
	return b.String(), nil
}

// The cloud-config subset box writes. Marshalling structs, not pasting
// strings, is what keeps the output valid YAML whatever the values hold.
type cloudConfig struct {
	Users          []cloudUser `yaml:"users"`
	PackageUpdate  bool        `yaml:"package_update"`
	PackageUpgrade bool        `yaml:"package_upgrade"`
	Packages       []string    `yaml:"packages"`
	WriteFiles     []writeFile `yaml:"write_files,omitempty"`
	Runcmd         []string    `yaml:"runcmd"`
}

type cloudUser struct {
	Name       string `yaml:"name"`
	Gecos      string `yaml:"gecos"`
	Homedir    string `yaml:"homedir"`
	Shell      string `yaml:"shell"`
	LockPasswd bool   `yaml:"lock_passwd"`
	Sudo       string `yaml:"sudo"`
}

type writeFile struct {
	Path        string `yaml:"path"`
	Owner       string `yaml:"owner"`
	Permissions string `yaml:"permissions"`
	// Defer to cloud-init's final stage: write_files otherwise runs before
	// the user exists, and the owner could not be set.
	Defer   bool   `yaml:"defer"`
	Content string `yaml:"content"`
}

// UserData renders the template as cloud-init user-data (see the package
// comment for what it does and why).
func (t *Template) UserData(opts RenderOptions) (string, error) {
	if err := t.Validate(); err != nil {
		return "", err
	}
	if err := opts.validate(); err != nil {
		return "", fmt.Errorf("render user-data: %w", err)
	}
	owner := t.User + ":" + t.User
	cc := cloudConfig{
		Users: []cloudUser{{
			Name:    t.User,
			Gecos:   "box user",
			Homedir: t.Home(),
			Shell:   "/bin/bash",
			// No password at all: the operator enters with box shell /
			// box exec, which need none, and a box holds no secrets.
			LockPasswd: true,
			Sudo:       "ALL=(ALL) NOPASSWD:ALL",
		}},
		PackageUpdate: true,
		// Upgrading every package would double mint time; a box is
		// short-lived and its image is rebuilt upstream.
		PackageUpgrade: false,
		Packages:       append([]string(nil), basePackages...),
	}
	// Clear a marker a clone may have inherited, before anything else runs.
	cc.Runcmd = append(cc.Runcmd, clearMarkers())

	checks := []check{{fmt.Sprintf("id -u %s >/dev/null 2>&1", t.User), "user " + t.User + " was not created"}}

	if a := t.Agent; a != nil {
		cc.Packages = appendNew(cc.Packages, AgentPackages...)
		ctx, err := t.ContextFile(opts)
		if err != nil {
			return "", err
		}
		ctxPath := t.ContextPath()
		cc.WriteFiles = append(cc.WriteFiles, writeFile{
			Path: ctxPath, Owner: owner, Permissions: "0644", Defer: true, Content: ctx,
		})
		// write_files creates missing parent folders as root; the agent
		// writes its own config beside the context file, so hand the
		// folder to the user.
		if rel, _ := contextRel(a.ContextFile); strings.Contains(rel, "/") {
			top, _, _ := strings.Cut(rel, "/")
			cc.Runcmd = append(cc.Runcmd, fmt.Sprintf("chown -R %s %s", owner, path.Join(t.Home(), top)))
		}
		// The prefix is explicit because distributions disagree on npm's
		// default one; retried because a registry hiccup should not cost
		// a whole mint. HOME is set because cloud-init runs without one.
		cc.Runcmd = append(cc.Runcmd, fmt.Sprintf(
			"for i in 1 2 3; do env HOME=/root npm_config_update_notifier=false npm install -g --prefix /usr/local --no-fund --no-audit %s && break; sleep 10; done",
			a.Package))
		bin := path.Join(BinDir, a.Command)
		checks = append(checks,
			check{"test -x " + bin, fmt.Sprintf("agent command %s is not in %s (npm install -g %s failed?)", a.Command, BinDir, a.Package)},
			check{"test -s " + ctxPath, "context file " + ctxPath + " was not written"},
		)
	}
	cc.Runcmd = append(cc.Runcmd, markerLine(MarkerDir, t.Name, checks))

	var body strings.Builder
	enc := yaml.NewEncoder(&body)
	enc.SetIndent(2)
	if err := enc.Encode(&cc); err != nil {
		return "", fmt.Errorf("render user-data: %w", err)
	}
	if err := enc.Close(); err != nil {
		return "", fmt.Errorf("render user-data: %w", err)
	}
	header := fmt.Sprintf("#cloud-config\n%s%s from template %q for box %q.\n", renderedBy, orUnknown(opts.BoxVersion), t.Name, opts.BoxName)
	if opts.Image {
		header = fmt.Sprintf("#cloud-config\n%s%s from template %q for its image.\n", renderedBy, orUnknown(opts.BoxVersion), t.Name)
	}
	return header + body.String(), nil
}

// renderedBy starts the second line of every user-data box renders: what
// ForClone recognises as its own.
const renderedBy = "# Rendered by box "

func clearMarkers() string { return fmt.Sprintf("rm -f %s %s", ReadyMarker, FailedMarker) }

// ForClone turns the user-data box rendered for a box (UserData, or
// ForClone for a clone) into its clone's: the same user and the same
// checks, which write the clone's own ReadyMarker or FailedMarker, and
// nothing else. The image's seed templates render again on a copy, so a
// clone is a new cloud-init instance and would otherwise install every
// package and the agent again: minutes, a network its egress allowlist may
// not allow, and an agent upgraded under the state the operator logged in
// with. The clone's disk already holds all of it. Other user-data (not
// box's, or edited since) is not box's to change: ok is false.
func ForClone(userData, clone string) (_ string, ok bool) {
	return forCopy(userData, fmt.Sprintf("for the clone %q: its source's user and checks; nothing is installed again (its disk has it all).", clone))
}

// forCopy is box's user-data reduced to its user and its checks, with
// note saying for whom; ok is false for user-data box did not render.
func forCopy(userData, note string) (_ string, ok bool) {
	header, body, _ := strings.Cut(userData, "\n")
	if header != "#cloud-config" || !strings.HasPrefix(body, renderedBy) {
		return "", false
	}
	var cc cloudConfig
	dec := yaml.NewDecoder(strings.NewReader(userData))
	dec.KnownFields(true)
	if err := dec.Decode(&cc); err != nil || len(cc.Users) == 0 || len(cc.Runcmd) == 0 {
		return "", false
	}
	report := cc.Runcmd[len(cc.Runcmd)-1]
	if !strings.Contains(report, ReadyMarker) || !strings.Contains(report, FailedMarker) {
		return "", false
	}
	// The users stay: without them cloud-init would make the image's
	// default user in the clone. Nothing is installed, written or updated.
	out := cloudConfig{Users: cc.Users, Packages: []string{}, Runcmd: []string{clearMarkers(), report}}
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&out); err != nil {
		return "", false
	}
	if err := enc.Close(); err != nil {
		return "", false
	}
	return fmt.Sprintf("#cloud-config\n%s%s\n", renderedBy, note) + b.String(), true
}

// check is a shell test and what to report when it fails; the last runcmd
// line turns all of them into exactly one marker. Neither may hold a double
// quote, '$', '`' or a backslash: validation keeps them to plain names and paths.
type check struct{ test, fail string }

// markerLine writes ReadyMarker when every check passes, else FailedMarker
// holding the failures and where to look. The failed marker is written to a
// temporary name and renamed, so a reader never sees it half-written.
func markerLine(dir, name string, checks []check) string {
	var b strings.Builder
	ready, failed := path.Join(dir, path.Base(ReadyMarker)), path.Join(dir, path.Base(FailedMarker))
	fmt.Fprintf(&b, "mkdir -p %s; fail=''; ", dir)
	for _, c := range checks {
		fmt.Fprintf(&b, "%s || fail=\"${fail}%s; \"; ", c.test, c.fail)
	}
	fmt.Fprintf(&b, "if [ -z \"$fail\" ]; then echo %s > %s; ", name, ready)
	fmt.Fprintf(&b, "else printf '%%s\\n' \"${fail}see /var/log/cloud-init-output.log\" > %s.tmp && mv %s.tmp %s; fi",
		failed, failed, failed)
	return b.String()
}

func appendNew(list []string, more ...string) []string {
	for _, m := range more {
		if !slices.Contains(list, m) {
			list = append(list, m)
		}
	}
	return list
}

func orUnknown(s string) string {
	if s == "" {
		return "(unknown version)"
	}
	return s
}
