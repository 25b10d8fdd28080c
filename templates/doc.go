// Package templates holds box's templates as typed, embedded data and renders
// each into cloud-init user-data.
//
// A template is a description, a default image, the unprivileged user the
// agent runs as, default resources and, for the agent templates, the agent
// (its npm package, its command and its context file). The four built-in
// templates are blank (the default), claude, codex and grok; they live in
// builtin/<name>/template.yaml and are compiled into the binary.
//
// Decoding is strict: an unknown key is an error that names the key and the
// template. There is deliberately no field for a network, a profile, a device
// or any security.* key, so a template cannot move a box off the isolation
// stack; the stack package alone decides how a box is attached. nesting: true
// (containers inside the box) is a choice the stack turns into the instance
// keys it stands for, which its census knows.
//
// A box is minted like this:
//
//	t, err := templates.Get(name) // "" is not a name; use templates.Default
//	if err != nil {
//		return err // lists the available templates
//	}
//	res, err := templates.MergeResources(t, os.Getenv, templates.Resources{
//		CPU: cpuFlag, Memory: memFlag, Disk: diskFlag,
//	})
//	if err != nil {
//		return err
//	}
//	userData, err := t.UserData(templates.RenderOptions{BoxName: n, BoxVersion: v})
//	if err != nil {
//		return err
//	}
//	// Create the instance from t.Image (or the --image / BOX_IMAGE override)
//	// with limits.cpu=res.CPU, limits.memory=res.Memory, root size=res.Disk
//	// (an empty one, from templates.NoLimit, is left unset)
//	// and cloud-init.user-data=userData, start it, then wait until
//	// templates.ReadyMarker exists in it (or templates.FailedMarker, whose
//	// content says what went wrong).
//
// # What the user-data does, and why
//
// It creates the template's user with a locked password and passwordless
// sudo inside the box. The box is the trust boundary: isolation is enforced
// by the host (bridge, nftables, ACL), never inside the box, and the drill
// already assumes an attacker with root in the box. Sudo inside therefore
// costs no isolation, and a coding agent routinely needs to install packages.
//
// For an agent template it installs nodejs, npm, git, ca-certificates and
// curl, runs npm install -g with the prefix /usr/local so the agent's command
// lands in /usr/local/bin (on the PATH Incus gives a non-interactive exec, not
// only a login shell's), and writes the agent's context file into the user's
// home, owned by the user. The agent is installed unauthenticated: a box is
// creds-free and the operator logs in inside it.
//
// Last, it writes ReadyMarker when everything above worked, or FailedMarker
// with the reason when it did not, so box can stop waiting either way.
//
// A clone of a box is a new cloud-init instance (the image's seed renders
// again on a copy); ForClone gives it user-data of its own that keeps the
// user and the checks and installs nothing again.
package templates
