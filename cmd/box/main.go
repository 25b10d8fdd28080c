// Command box mints trust-less, network-isolated Incus boxes for coding
// agents and runs their daily life (list, exec, shell, snapshot, clone,
// remove) behind the ownership tag. It is a thin consumer of the stack
// package; every command is one row of the command table in commands.go.
// See `box help`.
package main

import "os"

func main() { os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }
