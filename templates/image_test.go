package templates

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

func TestHash(t *testing.T) {
	claude, err := Get("claude")
	require.NoError(t, err)
	h1, err := claude.Hash()
	require.NoError(t, err)
	h2, err := claude.Hash()
	require.NoError(t, err)
	assert.Equal(t, h1, h2, "one template, one hash")
	assert.Len(t, h1, 64)

	blank, err := Get("blank")
	require.NoError(t, err)
	hb, err := blank.Hash()
	require.NoError(t, err)
	assert.NotEqual(t, h1, hb, "another template, another hash")

	// A change to what the image holds changes the hash: the agent's
	// package, the user, the context file.
	for name, edit := range map[string]func(t *Template){
		"agent package": func(t *Template) { t.Agent.Package = "@anthropic-ai/claude-code@2" },
		"user":          func(t *Template) { t.User = "other" },
		"resources":     func(t *Template) { t.Resources.CPU = "3" },
		"description":   func(t *Template) { t.Description += "!" },
	} {
		c := *claude
		a := *claude.Agent
		c.Agent = &a
		edit(&c)
		h, err := c.Hash()
		require.NoError(t, err, name)
		assert.NotEqual(t, h1, h, "a changed %s is a stale image", name)
	}
}

func TestImageUserData(t *testing.T) {
	claude, err := Get("claude")
	require.NoError(t, err)
	ud, err := claude.UserData(RenderOptions{BoxVersion: "v1", Image: true})
	require.NoError(t, err)
	assert.Contains(t, ud, "from template \"claude\" for its image.")
	assert.Contains(t, ud, `into the "claude" template's image`, "the context file says it was written into the image, for no box in particular")
	assert.NotContains(t, ud, "for box")
}

func TestCopyUserData(t *testing.T) {
	for _, name := range []string{"blank", "claude", "codex", "grok"} {
		tpl, err := Get(name)
		require.NoError(t, err)
		ud, err := tpl.CopyUserData("work", "v1")
		require.NoError(t, err, name)
		require.True(t, strings.HasPrefix(ud, "#cloud-config\n"+renderedBy+"for the box \"work\", a copy of template \""+name+"\"'s image"), name)
		var cc cloudConfig
		dec := yaml.NewDecoder(strings.NewReader(ud))
		dec.KnownFields(true)
		require.NoError(t, dec.Decode(&cc), name)
		assert.Empty(t, cc.Packages, "%s: nothing installed at mint", name)
		assert.Empty(t, cc.WriteFiles, "%s: nothing written", name)
		require.Len(t, cc.Users, 1)
		assert.Equal(t, tpl.User, cc.Users[0].Name)
		require.Len(t, cc.Runcmd, 2, "%s: the markers cleared, then the checks", name)
		assert.Contains(t, cc.Runcmd[1], ReadyMarker)
		if tpl.Agent != nil {
			assert.Contains(t, cc.Runcmd[1], "test -x "+BinDir+"/"+tpl.Agent.Command, "%s: the agent is checked in the copy too", name)
		}
	}
}

func TestCheckScript(t *testing.T) {
	claude, err := Get("claude")
	require.NoError(t, err)
	s := claude.CheckScript()
	assert.Contains(t, s, "test -s "+ReadyMarker)
	assert.Contains(t, s, "/usr/local/bin/claude --version", "the agent answers")
	assert.Contains(t, s, "HOME=$home", "with a throwaway HOME")
	assert.Contains(t, s, "rm -rf \"$home\"", "which goes again")
	assert.Contains(t, s, "test -s "+claude.ContextPath())
	blank, err := Get("blank")
	require.NoError(t, err)
	assert.NotContains(t, blank.CheckScript(), "--version", "blank has no agent")
}
