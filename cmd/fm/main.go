// Command fm is the Firstmate extension host. See `fm help`.
package main

import (
	"os"

	"firstmate.dev/fm/internal/cli"
	"firstmate.dev/fm/internal/launch"
)

func main() {
	launch.MaybeBarrier()
	os.Exit(cli.Run())
}
