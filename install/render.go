// Package install holds install.sh, the script a user runs to install box
// and drill from a signed release (docs/install.md), and renders it for a
// release: the release key's public part and fingerprint, and where the
// releases are, written into the script, which no setting can replace.
package install

import (
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

//go:embed install.sh
var script string

// DefaultRepo is where a release's install.sh fetches releases from unless
// BOX_REPO says otherwise: the project's releases (the world's release
// host stands in for it).
const DefaultRepo = "https://github.com/box-isolation/box/releases"

// Script is install.sh as it is in the repository: with no release key it
// refuses to install.
func Script() string { return script }

// fingerprint is an OpenPGP v4 fingerprint as gpgv's status lines give it.
var fingerprint = regexp.MustCompile(`^[0-9A-F]{40}$`)

// Render is install.sh for a release: key is the release key's public
// part (binary OpenPGP, as gpg --export writes it), fpr its fingerprint
// (40 hex digits, upper case), repo where the releases are (a URL or a
// directory).
func Render(key []byte, fpr, repo string) (string, error) {
	if len(key) == 0 {
		return "", errors.New("rendering install.sh: no release key")
	}
	if !fingerprint.MatchString(fpr) {
		return "", fmt.Errorf("rendering install.sh: %q is no OpenPGP fingerprint (40 upper-case hex digits)", fpr)
	}
	if repo == "" || strings.ContainsAny(repo, "'\n") {
		return "", fmt.Errorf("rendering install.sh: %q is no release location", repo)
	}
	out := script
	for ph, v := range map[string]string{"@BOX_RELEASE_KEY@": base64.StdEncoding.EncodeToString(key), "@BOX_RELEASE_FPR@": fpr, "@BOX_DEFAULT_REPO@": repo} {
		if strings.Count(out, ph) != 1 {
			return "", fmt.Errorf("rendering install.sh: %s appears %d times", ph, strings.Count(out, ph))
		}
		out = strings.Replace(out, ph, v, 1)
	}
	return out, nil
}
