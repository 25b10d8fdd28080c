// Command box mints trust-less, network-isolated Incus boxes for coding
// agents. Its verbs arrive with the stack package (see the project's
// issues); today it knows only what it can do honestly: its version.
package main

import (
	"fmt"
	"io"
	"os"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, out, errw io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "--help" || args[0] == "-h" {
		fmt.Fprintln(out, "box: trust-less, network-isolated Incus boxes for coding agents.")
		fmt.Fprintln(out, "\nCommands:\n  version    print box's version")
		return 0
	}
	if args[0] == "version" {
		fmt.Fprintf(out, "box %s\n", version)
		return 0
	}
	fmt.Fprintf(errw, "box: unknown command %q\nRun 'box help' for the list.\n", args[0])
	return 2
}
