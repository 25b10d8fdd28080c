// Command drill proves that box's isolation holds, with raw packets from
// inside boxes, and builds the hermetic world it runs in on development and
// CI machines. See `drill help`.
package main

import "os"

func main() { os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }
