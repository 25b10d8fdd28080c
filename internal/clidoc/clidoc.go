// Package clidoc renders a CLI's command table as shell completion scripts
// (bash, zsh, fish) and as a man page (roff), so that neither can offer a
// command or an option the table does not have. box and drill each turn
// their own table into a Program; nothing here knows either of them.
package clidoc

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Program is a CLI as its command table describes it.
type Program struct {
	Name    string // the binary: box
	Summary string // the man page's NAME line: what it is, in a phrase
	Version string
	// Description is the man page's DESCRIPTION, one paragraph an entry.
	Description []string
	Commands    []Command
	// Names is a shell pipeline that prints one name a line (box's names,
	// from `box list --json`), quiet on errors: arguments and flag values
	// of kind Name complete from it.
	Names string
	// Sections follow COMMANDS in the man page (EXIT STATUS, ENVIRONMENT,
	// SEE ALSO...).
	Sections []Section
}

// Section is a man page section: a title and its paragraphs.
type Section struct {
	Title      string
	Paragraphs []string
}

// Command is one row of a command table.
type Command struct {
	Name     string
	Synopsis string // without the program's name: "rm N [--force]"
	Help     string
	Flags    []Flag
	// Arg is what the first positional argument is; Values lists it when
	// it is one of a fixed set.
	Arg    Arg
	Values []string
	// Sub are the subcommands (drill world up, down...); a command with
	// subcommands takes them as its first argument.
	Sub []Command
}

// Arg is the kind of a positional argument or a flag's value.
type Arg int

const (
	ArgNone    Arg = iota // nothing to offer (free text, or files)
	ArgName               // a name from Program.Names
	ArgCommand            // one of the program's commands (help)
	ArgValues             // one of Values
)

// Flag is one option of a command.
type Flag struct {
	Name    string // without dashes
	Usage   string
	Default string // "" when there is none worth showing
	// Value is the placeholder of the flag's argument; empty for a
	// boolean flag, which takes none.
	Value string
	// Arg and Values say what the argument completes from.
	Arg    Arg
	Values []string
}

// FlagsOf lists the flags a flag set defines, in its order (sorted by
// name), with --help, which every command takes. names lists the flags
// whose value is a name (Program.Names); values the ones whose value is
// one of a fixed set.
func FlagsOf(fs *flag.FlagSet, names []string, values map[string][]string) []Flag {
	var out []Flag
	fs.VisitAll(func(f *flag.Flag) {
		fl := Flag{Name: f.Name, Usage: f.Usage}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
			fl.Value = strings.ToUpper(f.Name)
			if f.DefValue != "" && f.DefValue != "[]" {
				fl.Default = f.DefValue
			}
		}
		switch {
		case slices.Contains(names, f.Name):
			fl.Arg = ArgName
		case values[f.Name] != nil:
			fl.Arg, fl.Values = ArgValues, values[f.Name]
		}
		out = append(out, fl)
	})
	return append(out, Flag{Name: "help", Usage: "show the command's usage and options"})
}

// Shells are the shells Completion writes for.
var Shells = []string{"bash", "zsh", "fish"}

// Completion writes the completion script for shell.
func Completion(w io.Writer, p Program, shell string) error {
	switch shell {
	case "bash":
		return bash(w, p)
	case "zsh":
		return zsh(w, p)
	case "fish":
		return fish(w, p)
	}
	return fmt.Errorf("no completion for shell %q: one of %s", shell, strings.Join(Shells, ", "))
}

// node is a command with the key the scripts know it by: "world.up" for
// drill world up.
type node struct {
	key string
	Command
}

// nodes lists every command and subcommand, parents first.
func (p Program) nodes() []node {
	var out []node
	var walk func(prefix string, cs []Command)
	walk = func(prefix string, cs []Command) {
		for _, c := range cs {
			out = append(out, node{prefix + c.Name, c})
			walk(prefix+c.Name+".", c.Sub)
		}
	}
	walk("", p.Commands)
	return out
}

func (p Program) commandNames() []string {
	var out []string
	for _, c := range p.Commands {
		out = append(out, c.Name)
	}
	return out
}

func subNames(c Command) []string {
	var out []string
	for _, s := range c.Sub {
		out = append(out, s.Name)
	}
	return out
}

// ident makes a program name usable in shell function names.
func ident(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, name)
}

// shq quotes s for a POSIX shell (and zsh, and fish, which take '...'
// with \' inside; see fishq).
func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
